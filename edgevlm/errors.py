"""One exception family; each error knows the exit code the CLI leaves with."""

from __future__ import annotations


class EdgeVLMError(Exception):
    """Base of every error edgevlm raises on purpose; exits 1 unless a subclass says otherwise."""

    exit_code = 1


class UserError(EdgeVLMError):
    """Bad input from the user: a file, a flag, a model choice. Exits 2."""

    exit_code = 2


class ImageError(UserError):
    """An image that cannot be read or is unsafe to decode."""


class ModelError(UserError):
    """A model or projector file that is missing, corrupt or of the wrong kind."""


class ConfigError(UserError):
    """A flag or setting with a value that cannot work."""


class EngineError(EdgeVLMError):
    """llama.cpp refused an operation (decode failed, out of memory, …)."""


class EmptyMessageError(UserError):
    """A turn with nothing to ask: no text and no image."""


class ContextOverflowError(EngineError):
    """The prompt would not fit the context window."""

    exit_code = 2


class Interrupted(EdgeVLMError):
    """The user pressed Ctrl-C."""

    exit_code = 130


def one_line(exc: BaseException, *, limit: int = 160) -> str:
    """The first line of an exception's message (its type name when it has none), for users."""
    text = str(exc).strip().splitlines()
    return text[0][:limit] if text else type(exc).__name__
