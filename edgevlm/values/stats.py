"""What one request cost, stage by stage, and the one way a record of figures is flattened.

A turn's record is composed of parts (what the engine measured, how its images were shown,
what the cache held); `figures` lifts every part's fields and derived figures to one flat
mapping, the keys --json, --stats-json and the transcript publish (the API's edgevlm block picks
its published keys from it: server/turns.py). A new figure is a field of the part that owns it
and the line that measures it: it reaches those outputs through `figures`, with no other change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar

import numpy as np

# A field whose value is a part: its figures are lifted into its record's.
PART: Mapping[str, bool] = {"part": True}
# A field kept out of the flat figures (raw material for the derived ones).
RAW: Mapping[str, bool] = {"flat": False}


@dataclass(frozen=True)
class RequestStats:
    """What one request cost, stage by stage, as the engine measured it (llama/meter.py)."""

    DERIVED: ClassVar[tuple[str, ...]] = ("prefill_tok_s", "decode_tok_s", "itl_p50_s", "itl_p90_s")

    prefill_tokens: int  # positions decoded for the request (what the cache already held is not)
    visual_tokens: int
    completion_tokens: int
    clip_encodes: int
    preprocess_s: float
    clip_encode_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    restore_s: float = 0.0  # restoring a cached image prefix (part of TTFT, not of prefill_s)
    aside_prefill_tokens: int = 0  # decoded apart from the request (an earlier image's summary swap)
    token_gaps_s: tuple[float, ...] = field(default=(), metadata=RAW)  # between consecutive shown tokens

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
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first token comes from the prefill's logits; the rest are decode steps.
        steps = max(self.completion_tokens - 1, 0)
        return steps / self.decode_s if self.decode_s > 0 and steps else 0.0


def figures(record: object) -> dict[str, Any]:
    """A record's figures as one flat mapping: its own fields, each part's figures lifted in
    (a field declared with metadata=PART), and the derived figures a part names in DERIVED.
    The record's own fields win over a part's of the same name (a turn's completion_tokens
    counts the answer kept; its request's, every token shown). Nested values that are not
    parts (a found box) stay nested, as dicts."""
    if not is_dataclass(record) or isinstance(record, type):
        raise TypeError(f"figures() takes a dataclass instance, not {type(record).__name__}")
    own: dict[str, Any] = {}
    lifted: dict[str, Any] = {}
    for item in fields(record):
        value = getattr(record, item.name)
        if item.metadata.get("part"):
            lifted.update(figures(value))
        elif item.metadata.get("flat", True):
            own[item.name] = _nested(value)
    for name in getattr(type(record), "DERIVED", ()):
        lifted[name] = getattr(record, name)
    return lifted | own


def _nested(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {item.name: _nested(getattr(value, item.name)) for item in fields(value)}
    if isinstance(value, (tuple, list)):
        return type(value)(_nested(v) for v in value)
    return value
