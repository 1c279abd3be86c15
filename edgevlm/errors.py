"""One exception family; each error knows the exit code the CLI leaves with."""

from __future__ import annotations

import re
from collections.abc import Callable


class EdgeVLMError(Exception):
    """Base of every error edgevlm raises on purpose; exits 1 unless a subclass says otherwise.

    The core names settings by their own names (n_ctx, max_tokens, pool) and lists them in
    `settings`; each face puts them in its own words (`--n-ctx` on the command line, the
    field's name in the API) with `in_words`.
    """

    exit_code = 1

    def __init__(self, message: str = "", *, settings: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.settings = settings


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


def in_words(exc: BaseException, word: Callable[[str], str] | None = None) -> str:
    """The message, with each setting it names put in a face's words (unchanged without `word`)."""
    text = str(exc)
    if word is None:
        return text
    for name in getattr(exc, "settings", ()):
        text = re.sub(rf"(?<![\w-]){re.escape(name)}\b", word(name), text)
    return text


def one_line(exc: BaseException, *, limit: int = 160, word: Callable[[str], str] | None = None) -> str:
    """The first line of an exception's message (its type name when it has none), for users."""
    text = in_words(exc, word).strip().splitlines()
    return text[0][:limit] if text else type(exc).__name__
