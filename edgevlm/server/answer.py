"""An answer as the APIs send it: trimmed the same streamed or whole, read as a tool call when
tools were offered, and checked against the schema the request asked for."""

from __future__ import annotations

from dataclasses import dataclass

from edgevlm.chat.structured import OutputFormat
from edgevlm.chat.tools import ToolCall, ToolUse
from edgevlm.server.http import ApiError


@dataclass(frozen=True)
class AnswerShape:
    """What a request asks its answer to be: text, or JSON (`output`: response_format, Ollama's
    `format`), and with tools maybe a call to one of them. The grammar holds an answer to the
    shape; what a grammar cannot hold (a bound it drops, a cut-off answer) is checked here."""

    tools: ToolUse | None = None
    output: OutputFormat | None = None

    def read(self, text: str, *, cut: bool) -> tuple[str, ToolCall | None]:
        """A whole answer's text (stripped) and the call it makes, if any. An answer that ran into
        max_tokens (`cut`) is given as it is, its finish reason saying why; one that ended but
        does not have its shape is an ApiError (422): never an empty or invalid success."""
        text = text.strip()
        call = None
        if self.tools is not None:
            try:
                call = self.tools.parse(text)
            except ValueError as exc:
                if cut:  # a call cut off: not an answer (the finish reason, `length`, says so)
                    return ("", None) if text.startswith("{") else (text, None)
                raise _mismatch(str(exc)) from None
            if call is not None:
                return "", call
        if self.output is not None and not cut:
            try:
                self.output.parse(text)
            except ValueError as exc:
                raise _mismatch(str(exc)) from None
        return text, None


PLAIN = AnswerShape()


def _mismatch(reason: str) -> ApiError:
    return ApiError(422, f"the model's answer does not have the shape the request asked for: {reason}",
                    code="answer_mismatch", kind="server_error")


class AnswerText:
    """Turns the pieces of an answer into what a stream sends, so that the streamed text equals
    the whole answer stripped: leading white space is dropped, trailing white space is held
    until more text follows it. With tools, an answer that opens with `{` is held whole and
    read as a call at the end."""

    def __init__(self, shape: AnswerShape) -> None:
        self.shape = shape
        self._held = ""  # white space that may turn out to be trailing
        self._started = False
        self._is_call = False
        self.text = ""  # the whole answer so far, as generated

    def feed(self, piece: str) -> str:
        """The text to send now for this piece (maybe empty)."""
        self.text += piece
        if self._is_call:
            return ""
        if not self._started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self._started = True
            if self.shape.tools is not None and piece.startswith("{"):
                self._is_call = True
                return ""
        body = piece.rstrip()
        if not body:
            self._held += piece
            return ""
        out, self._held = self._held + body, piece[len(body):]
        return out

    def finish(self, *, cut: bool) -> tuple[str, ToolCall | None]:
        """At the end: text still to send, and the call if the answer was one; an ApiError (see
        AnswerShape.read) for an answer that ended without its shape."""
        text, call = self.shape.read(self.text, cut=cut)
        if call is not None or not self._is_call:
            return "", call
        return text, None  # held as a call, but JSON response_format asked for (sent at the end)
