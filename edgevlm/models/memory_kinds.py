"""What a text model keeps per sequence, one class per kind: plain attention, a sliding window,
a hybrid of recurrent and attention layers, or recurrent layers only.

The kind decides how the chat goes back in its cache (cut at any position, or restore a
checkpoint and re-decode the text after it), what the planner counts for the KV cache and the
checkpoints, and the note the plan prints. It is classified once, from the GGUF's facts
(models/gguf.py: TextModelFacts.memory); after loading, llama.cpp's own answer is checked
against it (`agrees`), so a disagreement is an error rather than a silent misplan.

Pure: nothing here imports llama_cpp or another folder of edgevlm.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

# llama_kv_cache_iswa pads a window's cells to this many.
WINDOW_PAD = 256


class MemoryKindName(str, Enum):
    """The kinds by name, as plans, stats and `--json` show them."""

    ATTENTION = "attention"
    SLIDING_WINDOW = "sliding-window"
    HYBRID = "hybrid"
    RECURRENT = "recurrent"


class MemoryKind(Protocol):
    """One kind of per-sequence memory."""

    name: MemoryKindName

    def can_cut(self, *, swa_full: bool) -> bool:
        """Whether the cache can be truncated at any position (else: checkpoints)."""
        ...

    def cache_choices(self, asked: bool | None) -> tuple[bool, ...]:
        """The swa_full settings the planner weighs (asked: the user's --swa-full or not)."""
        ...

    def window_cells(self, n_ctx: int, n_ubatch: int, *, swa_full: bool) -> int | None:
        """Cells one sequence's windowed layers hold (None: n_ctx, like the others)."""
        ...

    def checkpoint_bytes(self, cell_bytes: float, n_ctx: int, *, swa_full: bool) -> int:
        """One checkpoint of one sequence (chat/checkpoints.py); 0 where the cache is cut."""
        ...

    def note(self) -> str:
        """What the plan says about this kind ("" for plain attention)."""
        ...

    def agrees(self, *, recurrent: bool, hybrid: bool, n_swa: int) -> bool:
        """Whether llama.cpp's answer for the loaded model is this kind."""
        ...


@dataclass(frozen=True)
class Attention:
    """Every layer attends over the whole context: the cache is cut at any position."""

    name = MemoryKindName.ATTENTION

    def can_cut(self, *, swa_full: bool) -> bool:
        """Always."""
        return True

    def cache_choices(self, asked: bool | None) -> tuple[bool, ...]:
        """No window to keep whole."""
        return (False,)

    def window_cells(self, n_ctx: int, n_ubatch: int, *, swa_full: bool) -> int | None:
        """No windowed layers."""
        return None

    def checkpoint_bytes(self, cell_bytes: float, n_ctx: int, *, swa_full: bool) -> int:
        """None needed."""
        return 0

    def note(self) -> str:
        """Nothing to say."""
        return ""

    def agrees(self, *, recurrent: bool, hybrid: bool, n_swa: int) -> bool:
        """No recurrent layers and no window."""
        return not (recurrent or hybrid or n_swa)


@dataclass(frozen=True)
class SlidingWindow:
    """Some layers attend only within the last n_swa tokens (Gemma 3): their cache is either kept
    whole (llama.cpp's swa_full, cut anywhere) or a window's worth, with checkpoints of it."""

    n_swa: int  # the window, in tokens
    n_swa_layers: int  # the layers with a cache of their own that use it
    n_layer: int
    n_shared_kv_layers: int = 0  # the last layers, which reuse earlier layers' KV (Gemma 4)
    name = MemoryKindName.SLIDING_WINDOW

    def can_cut(self, *, swa_full: bool) -> bool:
        """Only when the whole window cache is kept."""
        return swa_full

    def cache_choices(self, asked: bool | None) -> tuple[bool, ...]:
        """Both ways, unless the user said."""
        return (True, False) if asked is None else (asked,)

    def window_cells(self, n_ctx: int, n_ubatch: int, *, swa_full: bool) -> int | None:
        """The window and one ubatch, padded to 256 (llama_kv_cache_iswa), unless kept whole."""
        if swa_full or not self.n_swa_layers:
            return None
        return -(-min(n_ctx, self.n_swa + n_ubatch) // WINDOW_PAD) * WINDOW_PAD

    def checkpoint_bytes(self, cell_bytes: float, n_ctx: int, *, swa_full: bool) -> int:
        """The cells inside the window on the windowed layers (llama.cpp copies out only those,
        not the ubatch's room); 0 when kept whole."""
        if swa_full:
            return 0
        return int(cell_bytes * min(n_ctx, self.n_swa) * self.n_swa_layers)

    def note(self) -> str:
        """The window and its layers."""
        shared = (f" (the last {self.n_shared_kv_layers} reuse earlier layers' KV)"
                  if self.n_shared_kv_layers else "")
        return (f"sliding window of {self.n_swa} tokens on {self.n_swa_layers} of {self.n_layer} "
                f"layers{shared}")

    def agrees(self, *, recurrent: bool, hybrid: bool, n_swa: int) -> bool:
        """A window, no recurrent layers."""
        return not (recurrent or hybrid) and n_swa > 0


@dataclass(frozen=True)
class Hybrid:
    """Some layers keep a recurrent state (LFM2, Granite 4, Qwen3.5, Nemotron-H, …): the cache
    cannot be cut at a position, so the chat goes back through checkpoints of that state."""

    state_bytes: int  # one sequence's recurrent state (0 where edgevlm does not know its shape)
    name = MemoryKindName.HYBRID

    def can_cut(self, *, swa_full: bool) -> bool:
        """Never."""
        return False

    def cache_choices(self, asked: bool | None) -> tuple[bool, ...]:
        """A window on its attention layers is checkpointed anyway: no choice."""
        return (False,)

    def window_cells(self, n_ctx: int, n_ubatch: int, *, swa_full: bool) -> int | None:
        """Its attention layers hold n_ctx."""
        return None

    def checkpoint_bytes(self, cell_bytes: float, n_ctx: int, *, swa_full: bool) -> int:
        """The recurrent state."""
        return self.state_bytes

    def note(self) -> str:
        """How the summary swap goes back."""
        return _recurrent_note(self.name)

    def agrees(self, *, recurrent: bool, hybrid: bool, n_swa: int) -> bool:
        """llama.cpp says hybrid."""
        return hybrid and not recurrent


@dataclass(frozen=True)
class Recurrent:
    """Every layer keeps a recurrent state (Mamba, RWKV): checkpoints, as for a hybrid."""

    state_bytes: int
    name = MemoryKindName.RECURRENT

    def can_cut(self, *, swa_full: bool) -> bool:
        """Never."""
        return False

    def cache_choices(self, asked: bool | None) -> tuple[bool, ...]:
        """No window."""
        return (False,)

    def window_cells(self, n_ctx: int, n_ubatch: int, *, swa_full: bool) -> int | None:
        """No windowed layers."""
        return None

    def checkpoint_bytes(self, cell_bytes: float, n_ctx: int, *, swa_full: bool) -> int:
        """The recurrent state."""
        return self.state_bytes

    def note(self) -> str:
        """How the summary swap goes back."""
        return _recurrent_note(self.name)

    def agrees(self, *, recurrent: bool, hybrid: bool, n_swa: int) -> bool:
        """llama.cpp says recurrent."""
        return recurrent


def _recurrent_note(name: MemoryKindName) -> str:
    return (f"{name.value} memory: its recurrent state cannot be cut at a position, so the summary swap "
            "goes back through checkpoints of it at turn boundaries (16 at most, a few KiB to MiB "
            "each) and re-decodes only the text after them")


def llama_says(*, recurrent: bool, hybrid: bool, n_swa: int) -> str:
    """llama.cpp's answer in words, for the error when it disagrees."""
    if recurrent:
        return "recurrent"
    if hybrid:
        return "hybrid"
    return f"a sliding window of {n_swa}" if n_swa else "plain attention"
