"""An answer as the APIs send it: trimmed the same streamed or whole, and read as a tool call
when tools were offered."""

from __future__ import annotations

from edgevlm.chat.tools import ToolCall, ToolUse


class AnswerText:
    """Turns the pieces of an answer into what a stream sends, so that the streamed text equals
    the whole answer stripped: leading white space is dropped, trailing white space is held
    until more text follows it. With tools, an answer that opens with `{` is held whole and
    read as a call at the end."""

    def __init__(self, tools: ToolUse | None) -> None:
        self.tools = tools
        self._held = ""  # white space that may turn out to be trailing
        self._call = ""  # the text of a tool call, held whole
        self._started = False
        self._is_call = False
        self.text = ""  # the whole answer so far, as generated

    def feed(self, piece: str) -> str:
        """The text to send now for this piece (maybe empty)."""
        self.text += piece
        if self._is_call:
            self._call += piece
            return ""
        if not self._started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self._started = True
            if self.tools is not None and piece.startswith("{"):
                self._is_call, self._call = True, piece
                return ""
        body = piece.rstrip()
        if not body:
            self._held += piece
            return ""
        out, self._held = self._held + body, piece[len(body):]
        return out

    def finish(self) -> tuple[str, ToolCall | None]:
        """At the end: text still to send, and the call if the answer was one. A call cut off
        by max_tokens is neither: the grammar lets only a call open with `{`, so its fragment
        is not an answer (the finish reason, `length`, says what happened)."""
        if not self._is_call or self.tools is None:
            return "", None
        try:
            return "", self.tools.parse(self._call)
        except ValueError:
            return "", None


def whole_answer(text: str, tools: ToolUse | None) -> tuple[str, ToolCall | None]:
    """A whole answer's text (stripped) and the call it makes, if any."""
    text = text.strip()
    if tools is None:
        return text, None
    try:
        call = tools.parse(text)
    except ValueError:  # a call cut off by max_tokens (see AnswerText.finish)
        return ("", None) if text.startswith("{") else (text, None)
    return ("", call) if call is not None else (text, None)
