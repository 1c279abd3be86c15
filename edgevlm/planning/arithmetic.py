"""The estimate: what llama.cpp will allocate for a model, a projector and an allocation.

Pure arithmetic over facts read from the GGUF files; no llama imports. The compute-buffer
model was fitted to llama.cpp's own reports (see tests/planning/test_memory.py, which checks it against
the library on shape-faithful GGUFs):

- graph peak without flash attention: 4·u·max(n_ctx·(H+1) + 5E + 2E_kv, 3·ff + 4E, V + 1.5E)
  on the CPU backend; CUDA fuses the Q/K/V copies, so its attention term is n_ctx·(H+1) + 4E
  (296 MiB at n_ctx 4096 and 164 MiB at 2048 for a 7B llama, as llama.cpp reports on CUDA);
- with flash attention the n_ctx·H score matrix never exists: 4·u·max(3·ff + 4E, V + 1.5E)
  plus the f16 mask, 2·u·n_ctx;
- CLIP's graph for one view of P positions: 4·P²·heads + 4·P·(ff + 1.6·W), or with flash
  attention 4·P·(2·ff + 1.6·W); or the projection MLP's 4·P·(2·proj + 1.6·W) if larger;
- a tied output layer (no output.weight) costs a copy of token_embd only on a GPU.
"""

from __future__ import annotations

from edgevlm.families import family_for
from edgevlm.models.gguf import KvLayerShape, ProjectorFacts, TextModelFacts
from edgevlm.planning.values import (
    CUDA_CONTEXT_BYTES,
    DEFAULT_MARGIN_BYTES,
    HOST_COMPUTE_BYTES_FULL_OFFLOAD,
    KV_BYTES_PER_ELEMENT,
    NOTHING_KEPT,
    Allocation,
    Breakdown,
    RamKeeps,
)


def weights_on_gpu(text: TextModelFacts, n_gpu_layers: int) -> int:
    """Bytes llama.cpp puts on the GPU: the output layer first, then blocks from the last.

    A tied output layer (no output.weight) gets its own copy of token_embd on the GPU; on the
    host it reuses the mapped token_embd, so there it costs nothing.
    """
    n_gpu_layers = max(0, min(n_gpu_layers, text.n_layer + 1))
    if n_gpu_layers == 0:
        return 0
    n_blocks = n_gpu_layers - 1
    blocks = text.layer_bytes[text.n_layer - n_blocks:] if n_blocks else ()
    return _tied_copy(text) + text.output_bytes + sum(blocks)


def weights_on_host(text: TextModelFacts, n_gpu_layers: int) -> int:
    """Bytes that stay in system memory (token_embd always does)."""
    offloaded = weights_on_gpu(text, n_gpu_layers)
    return text.weight_bytes - (offloaded - _tied_copy(text) if offloaded else 0)


def _tied_copy(text: TextModelFacts) -> int:
    return text.token_embd_bytes if text.tied_embeddings else 0


def kv_bytes_per_layer(text: TextModelFacts, n_ctx: int, type_k: str = "f16", type_v: str = "f16", *,
                       window_cells: int | None = None, flash_attn: bool = True) -> int:
    """K and V for one layer: n_ctx x n_head_kv x head_dim each, at the cache type's size,
    averaged over every layer: a hybrid's attention layers alone hold any, and with window_cells
    a sliding-window model's windowed layers hold that many cells, not n_ctx. Without flash
    attention llama.cpp stores V transposed, every layer as wide as the widest (Gemma 4's window
    layers then take its global layers' V width)."""
    windowed = text.n_swa_layers
    window = n_ctx if window_cells is None else min(window_cells, n_ctx)
    widest_v = None if flash_attn else max(_v_width(text.global_shape), _v_width(text.window_shape))
    total = ((text.kv_layers - windowed) * n_ctx * _cell_bytes(text.global_shape, type_k, type_v, widest_v)
             + windowed * window * _cell_bytes(text.window_shape, type_k, type_v, widest_v))
    return int(total / text.n_layer)


def _v_width(shape: KvLayerShape) -> int:
    return shape.n_head_kv * shape.head_dim_v


def _cell_bytes(shape: KvLayerShape, type_k: str, type_v: str, v_width: int | None = None) -> float:
    """K and V of one cell on one attention layer of this shape (V `v_width` wide where given)."""
    return (shape.n_head_kv * shape.head_dim_k * KV_BYTES_PER_ELEMENT[type_k]
            + (v_width or _v_width(shape)) * KV_BYTES_PER_ELEMENT[type_v])


def windowed_cells(text: TextModelFacts, n_ctx: int, n_ubatch: int, n_seq: int, *,
                    swa_full: bool) -> int | None:
    """Every sequence's cells on the windowed layers, where the window cache is not kept whole."""
    cells = text.memory.window_cells(n_ctx, n_ubatch, swa_full=swa_full)
    return None if cells is None else cells * n_seq


def checkpoint_bytes(text: TextModelFacts, n_ctx: int, kv_type: str, *, swa_full: bool) -> int:
    """One checkpoint of one sequence (chat/checkpoints.py), as the model's memory kind says:
    a hybrid's recurrent state, a window's cells where the window cache is not kept whole."""
    return text.memory.checkpoint_bytes(_cell_bytes(text.window_shape, kv_type, kv_type), n_ctx,
                                        swa_full=swa_full)


def kv_bytes(text: TextModelFacts, n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """The whole KV cache: 2 x n_layer x n_head_kv x head_dim x n_ctx x bytes (KV heads, not heads)."""
    return text.n_layer * kv_bytes_per_layer(text, n_ctx, type_k, type_v)


def prefix_bytes(text: TextModelFacts, n_tokens: int, kv_type: str) -> int:
    """An image prefix as the prefix cache keeps it: its KV, and its rows as float32 (an upper
    bound: text labels keep tokens, not rows)."""
    return kv_bytes(text, n_tokens, kv_type, kv_type) + n_tokens * text.n_embd * 4


def compute_bytes(text: TextModelFacts, n_ctx: int, *, n_ubatch: int = 512, flash_attn: bool,
                  backend: str = "cuda", output_layer: bool = True) -> int:
    """llama.cpp's graph reserve for one ubatch (see the module docstring for the fit); without
    the output layer, for a device that holds only blocks."""
    u = min(n_ubatch, n_ctx)
    e, ff, v = text.n_embd, text.n_ff or 4 * text.n_embd, text.n_vocab
    e_kv = text.n_head_kv * text.head_dim_k
    ffn_phase = 3 * ff + 4 * e
    output_phase = v + 1.5 * e if output_layer else 0
    if flash_attn:
        floats = max(ffn_phase, output_phase)
        return int(4 * u * floats + 2 * u * n_ctx)
    attention_extra = 4 * e if backend == "cuda" else 5 * e + 2 * e_kv
    attention_phase = n_ctx * (text.n_head + 1) + attention_extra
    return int(4 * u * max(attention_phase, ffn_phase, output_phase))


def estimate(text: TextModelFacts, projector: ProjectorFacts, allocation: Allocation, *, on_gpu: bool = True,
             overhead_bytes: int = CUDA_CONTEXT_BYTES, margin_bytes: int = DEFAULT_MARGIN_BYTES,
             keeps: RamKeeps = NOTHING_KEPT) -> Breakdown:
    """Every component llama.cpp will allocate for these settings.

    n_seq sequences get n_ctx KV cells each; llama.cpp reserves the graph for all of them
    (measured for 4 sequences of 2048: KV 4x, compute 1.7x without flash attention and
    unchanged with it), so the cache and the graph's context terms are counted n_seq-fold.
    A sliding-window model's windowed layers hold the whole context only with swa_full; without
    it a window's worth, and the chat keeps checkpoints of that window in RAM.
    """
    a = allocation
    n_ctx, n_ubatch, n_seq, flash_attn, type_k = a.n_ctx, a.n_ubatch, a.n_seq, a.flash_attn, a.type_k
    swa_full = a.swa_full
    window = windowed_cells(text, n_ctx, n_ubatch, n_seq, swa_full=swa_full)
    one_checkpoint = checkpoint_bytes(text, n_ctx, type_k, swa_full=swa_full)
    n_ctx *= n_seq
    n_layers = text.n_layer + 1
    gpu_layers = max(0, min(a.n_gpu_layers, n_layers)) if on_gpu else 0
    gpu_blocks = max(0, gpu_layers - 1)
    kv_layer = kv_bytes_per_layer(text, n_ctx, type_k, a.type_v, window_cells=window, flash_attn=flash_attn)
    backend = "cuda" if on_gpu else "cpu"
    compute = compute_bytes(text, n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn, backend=backend)
    clip_on_gpu = a.mmproj_on_gpu and on_gpu
    if not on_gpu:
        compute_gpu, compute_host = 0, compute
    elif gpu_layers == n_layers:
        compute_gpu, compute_host = compute, HOST_COMPUTE_BYTES_FULL_OFFLOAD
    else:  # partial offload: a second graph runs on the host for the CPU layers
        compute_gpu = compute
        compute_host = compute_bytes(text, n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn,
                                     backend="cpu")
    return Breakdown(
        weights_gpu=weights_on_gpu(text, gpu_layers),
        weights_host=weights_on_host(text, gpu_layers),
        kv_gpu=kv_layer * gpu_blocks,
        kv_host=kv_layer * (text.n_layer - gpu_blocks),
        compute_gpu=compute_gpu,
        compute_host=compute_host,
        mmproj=projector.weight_bytes,
        mmproj_compute=family_for(projector).encoder_compute_bytes(projector, flash_attn=flash_attn),
        mmproj_on_gpu=clip_on_gpu,
        overhead=overhead_bytes if on_gpu else 0,
        margin=margin_bytes if on_gpu else 0,
        recurrent=text.recurrent_state_bytes * n_seq,
        checkpoints=keeps.checkpoint_ram(one_checkpoint) * n_seq,
    )
