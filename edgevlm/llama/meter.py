"""The running account of one request's work, which a sequence turns into RequestStats."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from edgevlm.values.stats import RequestStats


@dataclass
class RequestMeter:
    """Counts and seconds as they accrue; `started` is where TTFT counts from (perf_counter)."""

    started: float = field(default_factory=time.perf_counter)
    prefill_tokens: int = 0  # decoded for the request
    visual_tokens: int = 0
    completion_tokens: int = 0
    clip_encodes: int = 0
    preprocess_s: float = 0.0
    clip_encode_s: float = 0.0
    prefill_s: float = 0.0
    restore_s: float = 0.0  # restoring a cached image prefix instead of prefilling it
    aside_prefill_tokens: int = 0  # decoded apart from the request (an earlier image's summary swap)
    ttft_s: float = 0.0
    decode_s: float = 0.0
    token_gaps_s: list[float] = field(default_factory=list)
    first_at: float | None = None  # when the first token of the current generate call came
    last_at: float = 0.0

    def snapshot(self) -> RequestStats:
        """The numbers so far, frozen."""
        return RequestStats(
            prefill_tokens=self.prefill_tokens, visual_tokens=self.visual_tokens,
            completion_tokens=self.completion_tokens, clip_encodes=self.clip_encodes,
            preprocess_s=self.preprocess_s, clip_encode_s=self.clip_encode_s, prefill_s=self.prefill_s,
            restore_s=self.restore_s, ttft_s=self.ttft_s, decode_s=self.decode_s,
            aside_prefill_tokens=self.aside_prefill_tokens,
            token_gaps_s=tuple(self.token_gaps_s))

    def token_shown(self) -> None:
        """A generated token came: the first sets TTFT, the others add a gap."""
        now = time.perf_counter()
        self.completion_tokens += 1
        if self.first_at is None:
            self.first_at, self.ttft_s = now, now - self.started
        else:
            self.token_gaps_s.append(now - self.last_at)
        self.last_at = now

    def generation_ended(self) -> None:
        """Close the decode timing (or set TTFT when no token came at all)."""
        if self.first_at is not None:
            self.decode_s += time.perf_counter() - self.first_at
            self.first_at = None
        elif self.ttft_s == 0.0:
            self.ttft_s = time.perf_counter() - self.started
