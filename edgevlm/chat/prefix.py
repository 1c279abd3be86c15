"""A conversation's first image block, from the image-prefix cache when it has been seen before.

The prefix `[system, user-turn opening, image block]` is the same for every question about a
photo, so its KV is saved once prefilled and restored, instead of prefilled again, when a new
conversation (a describe run, a served request, a chat after /reset) opens with that photo. The
key is everything that decides that KV: the token ids before the block, the layout's plan and
steps, and each view's pixels (so orientation, grid and pooling are all part of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from edgevlm.chat.records import PrefillProgress, PreparedImage, Segment, TurnParts, TurnStats
from edgevlm.errors import ContextOverflowError, EngineError
from edgevlm.llama.types import ImageEmbedding, RequestStats
from edgevlm.store.prefix_cache import PrefixCache, PrefixEntry, PrefixPart

if TYPE_CHECKING:  # types only: importing the sequence would load libllama
    from edgevlm.chat.prompts import PromptFormat
    from edgevlm.llama.sequence import EngineSequence
    from edgevlm.vision.layout import ImageLayout, ImagePlan

NO_PREFIX = "none"  # the block was prefilled (no cache, a miss, or recomputing was faster)
IN_CONTEXT = "context"  # ask_again: the block was already in this context


class ImagePrefixes:
    """Restoring and keeping a conversation's opening image block."""

    segments: list[Segment]
    sequence: EngineSequence
    fmt: PromptFormat
    layout: ImageLayout
    prefix_cache: PrefixCache | None

    turn: int
    max_tokens: int
    _block_end: tuple[int, ImagePlan] | None
    _prefix_tier: str

    def ask_again(self, question: str, *, on_piece: Callable[[str], None] | None = None,
                  started: float | None = None) -> tuple[str, TurnStats]:
        """Another question about the image the last turn showed, from the same prefill: the
        cache goes back to the end of that image block, and only the question is decoded."""
        if self._block_end is None or self.turn == 0:
            raise EngineError("ask_again needs an answered image turn to go back to")
        block_end, plan = self._block_end
        self.sequence.begin_request(started=started)
        self._truncate_to(block_end)
        parts = self._parts(self.turn, question, with_image=True)
        if self.kv_tokens + len(parts.tail) + self.max_tokens + len(parts.suffix) > self.sequence.n_ctx:
            raise ContextOverflowError(f"the question is {len(parts.tail)} tokens, too long to ask "
                                       "beside this image; shorten it", settings=("max_tokens",))
        visual = sum(s.n_tokens for s in self.segments if s.visual and s.turn == self.turn)
        self.sequence.note_restored(visual, 0.0)
        self._append(Segment("user", parts.turn, parts.tail))
        prompt_tokens = self.kv_tokens
        answer, answer_tokens, _ = self._generate(parts, on_piece)
        generated = self.sequence.stats()
        self._append(Segment("answer", parts.turn, parts.suffix))
        self._prefix_tier = IN_CONTEXT
        stats = self._turn_stats(parts.turn, plan, generated, wait_s=0.0, dropped=0,
                                 completion_tokens=len(answer_tokens), prompt_tokens=prompt_tokens)
        return answer, stats

    if TYPE_CHECKING:  # the conversation's own, from ImageBlocks and KvLedger
        def _eval_block(self, prepared: PreparedImage, turn: int,
                        on_progress: Callable[[PrefillProgress], None] | None) -> None: ...
        def _append(self, segment: Segment) -> None: ...
        def _truncate_to(self, index: int) -> None: ...
        def _parts(self, turn: int, question: str, *, with_image: bool) -> TurnParts: ...
        def _generate(self, parts: TurnParts, on_piece: Callable[[str], None] | None
                      ) -> tuple[str, list[int], bool]: ...
        def _turn_stats(self, turn: int, plan: ImagePlan | None, generated: RequestStats, *,
                        wait_s: float, dropped: int, completion_tokens: int,
                        prompt_tokens: int) -> TurnStats: ...

    def _eval_opening_block(self, prepared: PreparedImage, parts: TurnParts,
                            on_progress: Callable[[PrefillProgress], None] | None) -> str:
        """Put the user turn's opening and its image block in the cache, restored when they open
        the conversation and are cached; returns where they came from: "ram", "disk" or "none"."""
        head = Segment("user", parts.turn, parts.head)
        cache = self.prefix_cache
        if cache is None or [s.kind for s in self.segments] != ["system"]:
            self._prefill_block(head, prepared, on_progress)
            return NO_PREFIX
        key = cache.key(self._prefix_key_parts(prepared, parts.head))
        found = cache.get(key)
        if found is None:
            cache.misses += 1
        elif not cache.clock.restore_wins(found[1], found[0].block_tokens, found[0].nbytes):
            cache.skipped += 1  # recomputing is faster here; the entry stays as it is
            self._prefill_block(head, prepared, on_progress)
            return NO_PREFIX
        elif self._restored(cache, key, *found, head, prepared, on_progress):
            return found[1]
        block_s = self._prefill_block(head, prepared, on_progress)
        block = self.segments[2:]
        cache.clock.note_prefill(sum(s.n_tokens for s in block), block_s)
        cache.put(key, PrefixEntry(self.sequence.n_past, tuple(_part(s) for s in block),
                                   self.sequence.save_state()))
        return NO_PREFIX

    def _prefill_block(self, head: Segment, prepared: PreparedImage,
                       on_progress: Callable[[PrefillProgress], None] | None) -> float:
        """Decode the turn's opening and its image block; returns the block's seconds (CLIP too)."""
        self._append(head)
        self._mark()  # where the image's summary will go: its swap re-decodes from here
        started = time.perf_counter()
        self._eval_block(prepared, head.turn, on_progress)
        return time.perf_counter() - started

    def _restored(self, cache: PrefixCache, key: str, entry: PrefixEntry, tier: str, head: Segment,
                  prepared: PreparedImage, on_progress: Callable[[PrefillProgress], None] | None) -> bool:
        """Restore a found entry; False (the entry dropped) when llama.cpp refuses it."""
        system = self.segments[0]
        started = time.perf_counter()
        try:
            self.sequence.restore_state(entry.state, entry.n_positions)
        except EngineError:  # an entry this build cannot read: prefill, and write it again
            cache.forget(key)
            self.segments = []
            self._append(system)
            return False
        restore_s = time.perf_counter() - started
        cache.clock.note_restore(tier, entry.nbytes, restore_s)
        if tier == "ram":
            cache.ram_hits += 1
        else:
            cache.disk_hits += 1
        self.segments.append(head)
        self.segments.extend(_segment(part, head.turn) for part in entry.parts)
        visual = sum(p.n_tokens for p in entry.parts if p.rows is not None)
        self.sequence.note_restored(visual, restore_s)
        if on_progress is not None:
            views, tokens = len(prepared.views), entry.block_tokens
            on_progress(PrefillProgress(views, views, tokens, tokens))
        return True

    def _prefix_key_parts(self, prepared: PreparedImage, head: tuple[int, ...]) -> list[bytes]:
        """Everything that decides the prefix's KV, as bytes for the cache's key."""
        opening = [*self.segments[0].tokens, *head]
        parts = [b"image-prefix-1", self.fmt.name.encode(), np.asarray(opening, dtype=np.int32).tobytes(),
                 self.layout.name.encode(), repr(prepared.plan).encode(),
                 repr(self.layout.steps(prepared.plan)).encode()]
        for view in prepared.views:
            pixels = np.asarray(view, dtype=np.uint8)
            parts += [repr(pixels.shape).encode(), pixels.tobytes()]
        return parts


def _part(segment: Segment) -> PrefixPart:
    view = segment.embedding
    if view is not None:
        return PrefixPart(segment.kind, rows=view.rows, positions=view.positions, n_pos=view.n_pos,
                          non_causal=view.non_causal)
    return PrefixPart(segment.kind, segment.tokens)


def _segment(part: PrefixPart, turn: int) -> Segment:
    if part.rows is not None:
        view = ImageEmbedding(part.rows, positions=part.positions, n_pos=part.n_pos,
                              non_causal=part.non_causal)
        return Segment(part.kind, turn, embedding=view)
    return Segment(part.kind, turn, part.tokens)
