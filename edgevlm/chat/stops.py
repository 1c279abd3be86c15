"""Stop sequences in streamed text: show what cannot start one, end at the first full one."""

from __future__ import annotations


class StopScanner:
    """Feed pieces in; get back the text that is safe to show and whether a stop was reached.

    Text that might be the start of a stop sequence is held back until the next piece
    settles it, so a client never sees part of a stop string.
    """

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self.text = ""
        self._shown = 0
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Add a piece; returns the newly showable text (everything before a stop, once found)."""
        if self.stopped:
            return ""
        self.text += piece
        hits = [i for s in self.stops if (i := self.text.find(s)) >= 0]
        if hits:
            self.stopped = True
            self.text = self.text[:min(hits)]
            return self._show(len(self.text))
        return self._show(len(self.text) - self._held())

    def flush(self) -> str:
        """Whatever was held back, once the text has ended without a stop."""
        return self._show(len(self.text))

    def _held(self) -> int:
        """The longest end of the text that is also the start of some stop sequence."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _show(self, end: int) -> str:
        out = self.text[self._shown:end]
        self._shown = max(self._shown, end)
        return out
