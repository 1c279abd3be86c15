"""What one request cost, stage by stage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestStats:
    """What one request cost, stage by stage."""

    prompt_tokens: int
    visual_tokens: int
    completion_tokens: int
    clip_encodes: int
    preprocess_s: float
    clip_encode_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    restore_s: float = 0.0  # restoring a cached image prefix (part of TTFT, not of prefill_s)
    aside_tokens: int = 0  # decoded apart from the request (an earlier image's summary swap)
    token_gaps_s: tuple[float, ...] = ()  # time between consecutive shown tokens

    @property
    def itl_p50_s(self) -> float:
        """Median inter-token latency."""
        return float(np.median(self.token_gaps_s)) if self.token_gaps_s else 0.0

    @property
    def itl_p90_s(self) -> float:
        """90th-percentile inter-token latency (the stutter a reader notices)."""
        return float(np.percentile(self.token_gaps_s, 90)) if self.token_gaps_s else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first token comes from the prefill's logits; the rest are decode steps.
        steps = max(self.completion_tokens - 1, 0)
        return steps / self.decode_s if self.decode_s > 0 and steps else 0.0
