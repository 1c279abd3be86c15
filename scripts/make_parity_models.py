"""Tiny reference checkpoints for the parity tests, built by transformers and written as the GGUF
pair edgevlm loads: run in the reference venv (`make parity-env`), which has torch, transformers
and gguf-py. Nothing is downloaded.

    .venv-parity/bin/python scripts/make_parity_models.py OUT_DIR CONVERTER

OUT_DIR/<family>/ gets each transformers checkpoint (save_pretrained: config.json,
model.safetensors, preprocessor_config.json, tokenizer.json) with fixed-seed random weights, and
its GGUF pair at f32: text.gguf and mmproj.gguf. For Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3 and
4, SmolVLM2, LFM2-VL and InternVL3 the pair is made by CONVERTER, llama.cpp's own
convert_hf_to_gguf.py from the pinned sources (make parity-env unpacks them), from the checkpoint
as saved (Gemma 3's, LFM2-VL's and InternVL3's towers renamed to the published layout first).
LLaVA-1.6's needs llama.cpp's legacy scripts (convert_hf_to_gguf.py has no LLaVA-NeXT), which
take a LLaVA repository's own checkpoint: it is written with gguf-py in their layout, as
make_test_models.py writes its pairs. Both LLaVA towers are also converted by those legacy scripts
themselves (mmproj-legacy.gguf), where make parity-env installed the transformers 4 they import.
The vocabulary is the test models' (SmolLM2's with each family's image markers), so token ids
mean the same on both sides.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # edgevlm.parity.reference's tokenizer
import make_test_models as tm  # noqa: E402  (the test models' vocabulary and GGUF headers)

OUT = Path(__file__).resolve().parents[1] / "models" / "test" / "parity"
BUILD_TAG = "edgevlm parity checkpoint v4"
SEED = 11
# The tiny sizes: 2 text layers and 4 vision blocks (llama.cpp's converter names the merger's
# layers by block number, so a tower of 2 blocks has no name for its mlp.2); the published patch,
# merge, temporal patch and window (112 px) of Qwen2.5-VL, its full-attention blocks every other
# block (n_wa_pattern 2).
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": True,
        # weights drawn wider than transformers' default (0.02): logits spread enough that eight
        # greedy tokens differ from one another, so comparing them says something
        "initializer_range": 0.2,
        # transformers' M-RoPE split of a 16-wide head (8 pairs): temporal, height, width, as
        # make_test_models.py's header writes it for llama.cpp ([2, 2, 4, 0])
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 2, 4]}}
VISION = {"depth": 4, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 64,
          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
          "fullatt_block_indexes": [1, 3], "hidden_act": "silu"}


# Qwen2-VL: the same text; its tower of LayerNorm blocks with a quick-GELU MLP, no windows, 4
# blocks of width 32 (embed_dim; hidden_size is the width the merger hands the text model).
QWEN2_VISION = {"depth": 4, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "mlp_ratio": 2,
                "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                "hidden_act": "quick_gelu"}


def build_qwen25vl(folder: Path, vocab_source: Path, converter: Path) -> Path:
    """The tiny Qwen2.5-VL (see _build_qwen)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    return _build_qwen(folder, vocab_source, converter, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                       VISION)


def build_qwen2vl(folder: Path, vocab_source: Path, converter: Path) -> Path:
    """The tiny Qwen2-VL (see _build_qwen)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    return _build_qwen(folder, vocab_source, converter, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                       QWEN2_VISION)


def _build_qwen(folder: Path, vocab_source: Path, converter: Path, config_class: Any, model_class: Any,
                vision: dict[str, Any]) -> Path:
    """A Qwen2/2.5-VL transformers checkpoint, converted to its GGUF pair by llama.cpp's own
    converter, unless they are already current."""
    if _is_current(folder, BUILD_TAG):
        return folder
    import torch
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer, marker = _tokenizer(vocab_source, tm.VISION_TOKENS)
    torch.manual_seed(SEED)
    config = config_class(text_config={**TEXT, "vocab_size": len(tokenizer)}, vision_config=vision,
                          image_token_id=marker["<|image_pad|>"], video_token_id=marker["<|image_pad|>"],
                          vision_start_token_id=marker["<|vision_start|>"],
                          vision_end_token_id=marker["<|vision_end|>"], tie_word_embeddings=True,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = model_class(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor = Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 12_845_056},
                                         patch_size=14, merge_size=2, image_mean=tm.CLIP_MEAN,
                                         image_std=tm.CLIP_STD)
    processor.save_pretrained(folder)
    return _converted(folder, converter, BUILD_TAG)


# Qwen3-VL: Qwen3's attention (q and k normed; head 16, its M-RoPE interleaved over sections of
# 2, 3 and 3 pairs) in 4 text layers, and a tower of 4 blocks in 16 px patches with a learned 8x8
# position grid and deepstack features from blocks 1 and 2, added to text layers 0 and 1; the
# published processor's patch, merge and normalisation. (With as many deepstack layers as text
# layers, llama.cpp asserts on the first token, ggml_can_repeat: real models have 3 of 36.)
QWEN3_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
              "initializer_range": 0.2, "tie_word_embeddings": True,
              "rope_parameters": {"rope_theta": 5000000.0, "rope_type": "default", "mrope_section": [2, 3, 3],
                                  "mrope_interleaved": True}}
QWEN3_VISION = {"depth": 4, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 64,
                "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                "num_position_embeddings": 64, "deepstack_visual_indexes": [1, 2],
                "hidden_act": "gelu_pytorch_tanh", "initializer_range": 0.2}


def build_qwen3vl(folder: Path, vocab_source: Path, converter: Path) -> Path:
    """The tiny Qwen3-VL, converted by llama.cpp's own converter, unless already current."""
    if _is_current(folder, BUILD_TAG):
        return folder
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer, marker = _tokenizer(vocab_source, tm.VISION_TOKENS)
    torch.manual_seed(SEED)
    config = Qwen3VLConfig(text_config={**QWEN3_TEXT, "vocab_size": len(tokenizer)},
                           vision_config=QWEN3_VISION, image_token_id=marker["<|image_pad|>"],
                           video_token_id=marker["<|image_pad|>"],
                           vision_start_token_id=marker["<|vision_start|>"],
                           vision_end_token_id=marker["<|vision_end|>"], tie_word_embeddings=True)
    model = Qwen3VLForConditionalGeneration(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor = Qwen2VLImageProcessorPil(size={"shortest_edge": 64 * 64, "longest_edge": 16_777_216},
                                         patch_size=16, merge_size=2, image_mean=[0.5] * 3,
                                         image_std=[0.5] * 3)
    processor.save_pretrained(folder)
    return _converted(folder, converter, BUILD_TAG)


def _tokenizer(vocab_source: Path, markers: tuple[str, ...]) -> tuple[Any, dict[str, int]]:
    """The test models' vocabulary (SmolLM2's byte-level BPE) as a transformers tokenizer, with a
    family's markers added as special tokens after it, and each marker's id."""
    from edgevlm.parity.reference import _gguf_tokenizer

    tokenizer = _gguf_tokenizer(str(vocab_source))
    tokenizer.add_special_tokens({"additional_special_tokens": list(markers)})
    return tokenizer, {name: tokenizer.convert_tokens_to_ids(name) for name in markers}


def _rename_weights(folder: Path, rename: Callable[[str], str]) -> None:
    """The saved weights' names changed in place (transformers 5 saves some towers without the
    level the published checkpoints, and llama.cpp's converter, name; it reads them back either way)."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    save_file({rename(name): value for name, value in state.items()}, str(weights), metadata={"format": "pt"})


def _is_current(folder: Path, tag: str, stamp_name: str = "built.json") -> bool:
    """Whether the folder holds what this version of its builder builds (its tag in the stamp)."""
    stamp = folder / stamp_name
    return stamp.exists() and json.loads(stamp.read_text()).get("tag") == tag


def _source(converter: Path) -> str:
    """The llama.cpp sources a converter came with, for the stamp: the unpacked package's folder
    (peers/src/llama_cpp_python-X/vendor/llama.cpp/convert_hf_to_gguf.py: llama_cpp_python-X)."""
    return converter.parents[2].name


def _converted(folder: Path, converter: Path, tag: str) -> Path:
    """The saved checkpoint converted (_convert), and stamped with its builder's tag."""
    _convert(folder, converter)
    stamp = {"tag": tag, "seed": SEED, "converter": _source(converter)}
    (folder / "built.json").write_text(json.dumps(stamp))
    return folder


def _convert(folder: Path, converter: Path) -> None:
    """llama.cpp's convert_hf_to_gguf.py on the checkpoint: text.gguf and mmproj.gguf, at f32."""
    import subprocess

    for out, extra in (("text.gguf", []), ("mmproj.gguf", ["--mmproj"])):
        done = subprocess.run([sys.executable, str(converter), str(folder), "--outtype", "f32", *extra,
                               "--outfile", str(folder / out)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{converter.name} failed on {folder}:\n{done.stderr[-2000:]}")


# LLaVA-1.6 (LLaVA-NeXT), tiny: a CLIP tower of 112 px views (14 px patches: 8x8 features a view),
# its second-to-last layer's features (vision_feature_layer -2, the class token dropped), a GELU MLP
# projector, the learned newline, and a llama text model; the published pinpoints scaled to 112.
# Written with gguf-py in the legacy converter's layout (convert_image_encoder_to_gguf.py).
NEXT_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
               "image_size": 112, "patch_size": 14, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}
NEXT_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
             "max_position_embeddings": 4096, "tie_word_embeddings": True, "initializer_range": 0.2}
NEXT_PINPOINTS = [[112, 224], [224, 112], [224, 224], [336, 112], [112, 336]]
IMAGE_TOKEN = "<image>"


def build_llava_next(folder: Path, vocab_source: Path) -> Path:
    """The LLaVA-NeXT checkpoint and its GGUF pair (a llama text model, a CLIP mmproj with the
    pinpoints, spatial_unpad and the newline), unless they are already current."""
    if _is_current(folder, BUILD_TAG):
        return folder
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    tokens, types, merges, ids = tm._vocab(vocab_source)
    tokens, types = [*tokens, IMAGE_TOKEN], [*types, 3]  # 3: CONTROL
    torch.manual_seed(SEED)
    config = LlavaNextConfig(vision_config=CLIPVisionConfig(**NEXT_VISION),
                             text_config=LlamaConfig(**NEXT_TEXT, vocab_size=len(tokens),
                                                     bos_token_id=ids["bos_token_id"],
                                                     eos_token_id=ids["eos_token_id"]),
                             image_token_index=len(tokens) - 1, image_grid_pinpoints=NEXT_PINPOINTS,
                             vision_feature_layer=-2, vision_feature_select_strategy="default",
                             projector_hidden_act="gelu", tie_word_embeddings=True)
    model = LlavaNextForConditionalGeneration(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    side = NEXT_VISION["image_size"]
    processor = LlavaNextImageProcessorPil(image_grid_pinpoints=NEXT_PINPOINTS, size={"shortest_edge": side},
                                           crop_size={"height": side, "width": side},
                                           image_mean=tm.CLIP_MEAN, image_std=tm.CLIP_STD)
    processor.save_pretrained(folder)
    return _write_llava_pair(folder, (tokens, types, merges, ids), "llava-next", BUILD_TAG, anyres=True)


def _write_llava_pair(folder: Path, vocab: tuple, name: str, tag: str, *, anyres: bool) -> Path:
    """The GGUF pair of a saved LLaVA checkpoint, read as saved (the checkpoint's own names, as
    llama.cpp's scripts would read them), and the build's tag."""
    from safetensors.numpy import load_file

    saved = load_file(folder / "model.safetensors")
    state = {key: array.astype(np.float32) for key, array in saved.items()}
    _write_llama_text(folder / "text.gguf", state, vocab, name)
    _write_clip_mmproj(folder / "mmproj.gguf", state, name, anyres=anyres)
    if not anyres:  # as the documented LLaVA-1.5 conversion writes it (its tower's folder names no layer)
        _write_clip_mmproj(folder / "mmproj-unnamed.gguf", state, name, anyres=anyres, name_layer=False)
    (folder / "built.json").write_text(json.dumps({"tag": tag, "seed": SEED}))
    return folder


LLAVA15_TAG = "edgevlm parity checkpoint llava-1.5 v2"


def build_llava15(folder: Path, vocab_source: Path) -> Path:
    """LLaVA-1.5, tiny: LLaVA-NeXT's tower, projector and text model without the anyres parts (one
    view of the photo padded to a square in the mean colour, as llava-hf's processor with do_pad),
    written in the legacy scripts' layout as LLaVA-NeXT's is (convert_hf_to_gguf.py takes only
    Pixtral's LlavaForConditionalGeneration), unless already current."""
    if _is_current(folder, LLAVA15_TAG):
        return folder
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    tokens, types, merges, ids = tm._vocab(vocab_source)
    tokens, types = [*tokens, IMAGE_TOKEN], [*types, 3]  # 3: CONTROL
    torch.manual_seed(SEED)
    text = LlamaConfig(**NEXT_TEXT, vocab_size=len(tokens), bos_token_id=ids["bos_token_id"],
                       eos_token_id=ids["eos_token_id"])
    config = LlavaConfig(vision_config=CLIPVisionConfig(**NEXT_VISION), text_config=text,
                         image_token_index=len(tokens) - 1, vision_feature_layer=-2,
                         vision_feature_select_strategy="default", projector_hidden_act="gelu",
                         tie_word_embeddings=True)
    model = LlavaForConditionalGeneration(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    side = NEXT_VISION["image_size"]
    LlavaImageProcessorPil(do_pad=True, size={"shortest_edge": side},
                           crop_size={"height": side, "width": side}, image_mean=tm.CLIP_MEAN,
                           image_std=tm.CLIP_STD).save_pretrained(folder)
    return _write_llava_pair(folder, (tokens, types, merges, ids), "llava-1.5", LLAVA15_TAG, anyres=False)


# The tiny LLaVA towers also as llama.cpp's legacy scripts convert them (mmproj-legacy.gguf): the
# files users have, where the tests' own writer names the feature layer the scripts leave out.
LEGACY_TAG = "edgevlm parity legacy scripts v1"
LEGACY_FILE = "mmproj-legacy.gguf"
LEGACY_STAMP = "legacy.json"  # beside built.json: the legacy file has a builder of its own


def build_legacy_mmproj(folder: Path, converter: Path, transformers4: Path) -> Path | None:
    """The saved LLaVA checkpoint's tower and projector converted as llama.cpp's docs for LLaVA-1.6
    convert them (tools/mtmd/legacy-models: llava_surgery_v2.py -C on the checkpoint in llava-hf's
    layout, then convert_image_encoder_to_gguf.py --clip-model-is-vision on a folder of the tower's
    weights and its config, with the pinpoints where the checkpoint has them), at --use-f32, into
    folder/mmproj-legacy.gguf. The encoder script imports transformers 4's CLIPVisionModel (under 5 it
    stops at model.vision_model): it runs with `transformers4`, a folder of transformers 4 that make
    parity-env installs; None where that folder is missing."""
    import shutil
    import subprocess
    import tempfile

    out = folder / LEGACY_FILE
    if out.exists() and _is_current(folder, LEGACY_TAG, LEGACY_STAMP):
        return out
    if not (transformers4 / "transformers").is_dir():
        return None
    scripts = converter.parent / "tools" / "mtmd" / "legacy-models"
    config = json.loads((folder / "config.json").read_text())
    path = f"{transformers4}{os.pathsep}{converter.parent / 'gguf-py'}"
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}

    def run(script: str, *args: str) -> None:
        done = subprocess.run([sys.executable, str(scripts / script), *args], capture_output=True, text=True,
                              env=env)
        if done.returncode:
            raise SystemExit(f"{script} failed on {folder}:\n{done.stderr[-2000:]}")

    with tempfile.TemporaryDirectory() as work:
        model, vit = Path(work) / "model", Path(work) / "vit"
        model.mkdir()
        vit.mkdir()
        shutil.copy(folder / "model.safetensors", model / "model.safetensors")
        shutil.copy(folder / "config.json", model / "config.json")
        # transformers 5 saves the tower without the level llava-hf's checkpoints have
        _rename_weights(model, lambda name: name.replace("vision_tower.", "vision_tower.vision_model.", 1)
                        if name.startswith("vision_tower.") else name)
        tower = {**config["vision_config"], "architectures": ["CLIPVisionModel"],
                 "model_type": "clip_vision_model"}
        if "image_grid_pinpoints" in config:  # the vit/config.json the LLaVA-1.6 docs fetch
            tower |= {"image_grid_pinpoints": config["image_grid_pinpoints"],
                      "mm_patch_merge_type": "spatial_unpad", "image_aspect_ratio": "anyres"}
        (vit / "config.json").write_text(json.dumps(tower, indent=1))
        run("llava_surgery_v2.py", "-C", "-m", str(model))
        shutil.move(model / "llava.clip", vit / "pytorch_model.bin")
        shutil.move(model / "llava.projector", vit / "llava.projector")
        run("convert_image_encoder_to_gguf.py", "-m", str(vit), "--llava-projector",
            str(vit / "llava.projector"), "--output-dir", str(vit), "--clip-model-is-vision", "--use-f32",
            "--image-mean", *map(str, tm.CLIP_MEAN), "--image-std", *map(str, tm.CLIP_STD))
        shutil.move(vit / "mmproj-model-f32.gguf", out)
    stamp = {"tag": LEGACY_TAG, "scripts": _source(converter)}
    (folder / LEGACY_STAMP).write_text(json.dumps(stamp))
    return out


def _permuted(weights: np.ndarray, heads: int) -> np.ndarray:
    """q and k rows reordered from transformers' rotate-half rope to llama.cpp's pairwise one, as
    convert_hf_to_gguf.py's LlamaModel.permute does."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _write_llama_text(path: Path, state: dict[str, np.ndarray], vocab: tuple, name: str) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path.with_suffix(".part")), "llama")
    heads, kv_heads = NEXT_TEXT["num_attention_heads"], NEXT_TEXT["num_key_value_heads"]
    tm._text_header(writer, f"edgevlm-parity-{name}", vocab, tm.QWEN_TEMPLATE,
                    n_embd=NEXT_TEXT["hidden_size"],
                    n_layer=NEXT_TEXT["num_hidden_layers"], n_ff=NEXT_TEXT["intermediate_size"], n_head=heads,
                    n_head_kv=kv_heads, add_bos=False)
    text = "language_model.model."
    writer.add_tensor("token_embd.weight", state[f"{text}embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state[f"{text}norm.weight"])
    names = {"self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    for layer in range(NEXT_TEXT["num_hidden_layers"]):
        theirs, ours = f"{text}layers.{layer}.", f"blk.{layer}."
        writer.add_tensor(f"{ours}attn_q.weight", _permuted(state[f"{theirs}self_attn.q_proj.weight"], heads))
        keys = state[f"{theirs}self_attn.k_proj.weight"]
        writer.add_tensor(f"{ours}attn_k.weight", _permuted(keys, kv_heads))
        for name, target in names.items():
            writer.add_tensor(f"{ours}{target}.weight", state[f"{theirs}{name}.weight"])
    tm._finish(writer, path.with_suffix(".part"), path)


def _write_clip_mmproj(path: Path, state: dict[str, np.ndarray], name: str, *, anyres: bool,
                       name_layer: bool = True) -> None:
    """The legacy LLaVA mmproj layout, as tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py
    writes it: the blocks up to the feature layer (vision_feature_layer -2: all but the last) and
    that layer named (clip.vision.feature_layer, which the script writes only where the tower's
    config names it: not `name_layer`, as from openai's CLIP folder), fc1 and fc2 under its
    swapped names (ffn_down, ffn_up; clip.cpp swaps them back by shape); LLaVA-NeXT's pinpoints,
    merge type and newline where `anyres` (LLaVA-1.5's has none of them). The script itself
    (under transformers 4: it fails under 5) writes the same file but for the projector's
    matrices and the patch kernel, which it keeps at f16 even with --use-f32."""
    import gguf

    width, blocks = NEXT_VISION["hidden_size"], NEXT_VISION["num_hidden_layers"] - 1
    writer = gguf.GGUFWriter(str(path.with_suffix(".part")), "clip")
    flags = {"has_text_encoder": False, "use_gelu": False}
    tm._clip_header(writer, f"edgevlm-parity-{name}-mmproj", "mlp", flags,
                    eps=NEXT_VISION["layer_norm_eps"], image_size=NEXT_VISION["image_size"],
                    patch_size=NEXT_VISION["patch_size"], embedding_length=width,
                    feed_forward_length=NEXT_VISION["intermediate_size"],
                    projection_dim=NEXT_TEXT["hidden_size"],
                    head_count=NEXT_VISION["num_attention_heads"], block_count=blocks)
    if name_layer:
        writer.add_array("clip.vision.feature_layer", [blocks])
    if anyres:
        writer.add_array("clip.vision.image_grid_pinpoints", [v for pair in NEXT_PINPOINTS for v in pair])
        writer.add_string("clip.vision.mm_patch_merge_type", "spatial_unpad")
    tower = "vision_tower."
    writer.add_tensor("v.class_embd", state[f"{tower}embeddings.class_embedding"])
    writer.add_tensor("v.patch_embd.weight", state[f"{tower}embeddings.patch_embedding.weight"])
    writer.add_tensor("v.position_embd.weight", state[f"{tower}embeddings.position_embedding.weight"])
    for kind in ("weight", "bias"):
        writer.add_tensor(f"v.pre_ln.{kind}", state[f"{tower}pre_layrnorm.{kind}"])
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
             "mlp.fc1": "ffn_down",
             "mlp.fc2": "ffn_up"}
    for block in range(blocks):
        for name, target in names.items():
            for kind in ("weight", "bias"):
                writer.add_tensor(f"v.blk.{block}.{target}.{kind}",
                                  state[f"{tower}encoder.layers.{block}.{name}.{kind}"])
    for index, linear in ((0, "linear_1"), (2, "linear_2")):
        for kind in ("weight", "bias"):
            writer.add_tensor(f"mm.{index}.{kind}", state[f"multi_modal_projector.{linear}.{kind}"])
    if anyres:
        writer.add_tensor("model.image_newline", state["image_newline"])
    tm._finish(writer, path.with_suffix(".part"), path)


# Gemma 3: 2 text layers of width 64 (head 16, its query scaled by the head's width as llama.cpp
# reads it for every size but 27B), both sliding-window layers as llama.cpp's default pattern of
# 6 makes them in a 2-layer model (the window, 128, longer than any prompt here, so that the
# window itself is not what is compared); a SigLIP tower of 64 px images in 8 px patches pooled
# 2x2 into 16 tokens, as the test pair's.
GEMMA3_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 128,
               "layer_types": ["sliding_attention", "sliding_attention"], "rms_norm_eps": 1e-6,
               "max_position_embeddings": 4096, "initializer_range": 0.2,
               # an output matrix of its own: tied, the input embedding (scaled by 8 here) outweighs
               # two layers and every greedy token repeats the last one
               "tie_word_embeddings": False}
GEMMA3_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "image_size": 64, "patch_size": 8, "layer_norm_eps": 1e-6}
GEMMA3_MARKERS = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                  "<image_soft_token>")
GEMMA3_TAG = "edgevlm parity checkpoint gemma3 v2"


def build_gemma3(folder: Path, vocab_source: Path, converter: Path) -> Path:
    """A tiny Gemma 3 saved as the published checkpoints are laid out, and converted to its GGUF
    pair by llama.cpp's own converter (convert_hf_to_gguf.py, text and --mmproj, at f32)."""
    if _is_current(folder, GEMMA3_TAG):
        return folder
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tokenizer, marker = _tokenizer(vocab_source, GEMMA3_MARKERS)
    torch.manual_seed(SEED)
    config = Gemma3Config(text_config={**GEMMA3_TEXT, "vocab_size": len(tokenizer)},
                          vision_config=GEMMA3_VISION, mm_tokens_per_image=16,
                          image_token_index=marker["<image_soft_token>"],
                          boi_token_index=marker["<start_of_image>"],
                          eoi_token_index=marker["<end_of_image>"],
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, initializer_range=0.2,
                          tie_word_embeddings=False)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, weights in model.named_parameters():
            if name.endswith("mm_input_projection_weight"):
                weights.normal_(0.0, 0.2)  # transformers starts the projection at zero: no rows at all
            elif "norm" in name and weights.dim() == 1 and "vision_tower" not in name:
                weights.normal_(0.0, 0.1)  # Gemma's norms scale by 1 + w: at 0 a missed shift would hide
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    # transformers 5 saves the tower as vision_tower.*; the published checkpoints (and llama.cpp's
    # converter) have it as vision_tower.vision_model.*, which transformers loads the same
    _rename_weights(folder, lambda name: name if name.startswith("vision_tower.vision_model.")
                    else name.replace("vision_tower.", "vision_tower.vision_model.", 1))
    tokenizer.save_pretrained(folder)
    side = GEMMA3_VISION["image_size"]
    Gemma3ImageProcessorPil(size={"height": side, "width": side}, image_mean=[0.5] * 3,
                            image_std=[0.5] * 3).save_pretrained(folder)
    settings = json.loads((folder / "preprocessor_config.json").read_text())
    settings["image_seq_length"] = 16  # the converter reads the pooling from it
    (folder / "preprocessor_config.json").write_text(json.dumps(settings, indent=2))
    return _converted(folder, converter, GEMMA3_TAG)


# SmolVLM2: a SigLIP tower of 64 px images in 8 px patches, pixel-shuffled 2x2 into 16 tokens a
# view, on a 2-layer llama; its processor at the 256M/500M models' setting, where the longest edge
# is one tile (512 there, 64 here).
SMOLVLM_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
                "initializer_range": 0.2, "tie_word_embeddings": False, "rope_theta": 100000.0,
                # the converter takes the text model's architecture from here (SmolVLM2's says its own)
                "architectures": ["LlamaForCausalLM"]}
SMOLVLM_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "image_size": 64, "patch_size": 8}
SMOLVLM_MARKERS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>")


# SmolVLM2-2.2B's setting, where the longest edge is several tiles (1536 px in 384 px tiles there,
# 128 in 64 here): both sides cut an image into tiles and a global view, so stage 4 compares them
SMOLVLM_SPLIT_LONGEST = 128
SMOLVLM_SPLIT_TAG = "edgevlm parity checkpoint smolvlm-split v1"


def build_smolvlm(folder: Path, vocab_source: Path, converter: Path, *, longest: int = 0) -> Path:
    """The tiny SmolVLM2, converted by llama.cpp's own converter, unless already current; with
    `longest`, its processor resizes to that longest edge before cutting tiles (the same weights)."""
    tag = SMOLVLM_SPLIT_TAG if longest else BUILD_TAG
    if _is_current(folder, tag):
        return folder
    import torch
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    tokenizer, marker = _tokenizer(vocab_source, SMOLVLM_MARKERS)
    torch.manual_seed(SEED)
    config = SmolVLMConfig(text_config={**SMOLVLM_TEXT, "vocab_size": len(tokenizer)},
                           vision_config=SMOLVLM_VISION, image_token_id=marker["<image>"], scale_factor=2,
                           tie_word_embeddings=False)
    model = SmolVLMForConditionalGeneration(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    side = SMOLVLM_VISION["image_size"]
    SmolVLMImageProcessorPil(size={"longest_edge": longest or side}, max_image_size={"longest_edge": side},
                             do_image_splitting=True, image_mean=[0.5] * 3,
                             image_std=[0.5] * 3).save_pretrained(folder)
    return _converted(folder, converter, tag)


# Gemma 4: a tiny tower of 16 px patches pooled 3x3 (48 px a token) on a 2-layer text model (a
# window layer with 16-wide heads, then a global one with 32-wide heads and proportional RoPE on a
# quarter of them, as published), its images attended both ways (the 26B/31B models' setting;
# mtmd does so beside every text width but E2B's and E4B's), the published logit soft-cap, no
# per-layer inputs. The vocabulary is Gemma 4's own (llama.cpp ships it as a vocab-only GGUF for
# its tokenizer tests; the converter takes only an SPM-style BPE for Gemma 4), so its markers are
# at the config's published ids.
GEMMA4_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
               "layer_types": ["sliding_attention", "full_attention"], "hidden_size_per_layer_input": 0,
               "num_kv_shared_layers": 0, "final_logit_softcapping": 30.0,
               "use_bidirectional_attention": "vision", "initializer_range": 0.2,
               "max_position_embeddings": 4096}
GEMMA4_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 2, "head_dim": 16, "patch_size": 16, "pooling_kernel_size": 3,
                 "position_embedding_size": 1024}
GEMMA4_TAG = "edgevlm parity checkpoint gemma4 v1"


def build_gemma4(folder: Path, converter: Path) -> Path:
    """The tiny Gemma 4, converted by llama.cpp's own converter, unless already current."""
    if _is_current(folder, GEMMA4_TAG):
        return folder
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    from edgevlm.parity.reference import _gguf_tokenizer

    tokenizer = _gguf_tokenizer(str(converter.parent / "models" / "ggml-vocab-gemma-4.gguf"))
    # its control tokens (<|image>, <|image|>, <|turn>, ...) named special, as the published
    # tokenizer names them: the converter marks a token CONTROL only then, and llama.cpp (mtmd's
    # markers among them) parses only CONTROL tokens as one token
    tokenizer.add_special_tokens({"additional_special_tokens": sorted(
        str(token) for token in tokenizer.added_tokens_decoder.values()
        if token.special and str(token) not in tokenizer.all_special_tokens)})
    torch.manual_seed(SEED)
    config = Gemma4Config(text_config={**GEMMA4_TEXT, "vocab_size": len(tokenizer),
                                       "vocab_size_per_layer_input": len(tokenizer)},
                          vision_config=GEMMA4_VISION, audio_config=None, initializer_range=0.2)
    model = Gemma4ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, weights in model.named_parameters():
            if "norm" in name and weights.dim() == 1:
                weights.normal_(1.0, 0.2)  # transformers starts them at 1: a missed one would hide
            elif name.endswith("embed_tokens.weight"):
                # tied (the converter's --mmproj has no name for an lm_head) and scaled by
                # sqrt(64) on the way in: drawn at 0.2 or 0.05, the greedy tokens after an image
                # settled on one token by the third; at 0.02 eight are eight
                weights.normal_(0.0, 0.02)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    Gemma4ImageProcessorPil(max_soft_tokens=280, patch_size=GEMMA4_VISION["patch_size"],
                            pooling_kernel_size=GEMMA4_VISION["pooling_kernel_size"]).save_pretrained(folder)
    return _converted(folder, converter, GEMMA4_TAG)


# LFM2-VL: a tiny SigLIP2 NaFlex tower (16 px patches, 3 blocks: the converter maps the
# projector's linear_2 by block number, so a 2-block tower leaves it unnamed) without its pooling
# head (the published setting), the pixel unshuffle 2x2 and a layer-normed GELU projection, on a
# 2-layer LFM2 (a short-convolution layer, then attention). Its processor is the published one
# (transformers' defaults: 64-256 tokens a view, 512 px tiles, 2-10 of them and a thumbnail),
# written as preprocessor_config.json (saving the class would import torchvision in this process).
LFM2_TEXT = {"architectures": ["Lfm2ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "layer_types": ["conv", "full_attention"], "block_ff_dim": 128,
             "block_auto_adjust_ff_dim": False, "max_position_embeddings": 4096, "initializer_range": 0.2}
LFM2_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
               "patch_size": 16, "num_patches": 256, "vision_use_head": False}
LFM2_PROCESSOR = {"image_processor_type": "Lfm2VlImageProcessor", "image_mean": [0.5] * 3,
                  "image_std": [0.5] * 3, "downsample_factor": 2, "encoder_patch_size": 16,
                  "min_image_tokens": 64, "max_image_tokens": 256, "do_image_splitting": True,
                  "min_tiles": 2, "max_tiles": 10, "tile_size": 512, "max_pixels_tolerance": 2.0,
                  "use_thumbnail": True}
LFM2_MARKERS = ("<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>")
LFM2_TAG = "edgevlm parity checkpoint lfm2-vl v2"


def build_lfm2vl(folder: Path, vocab_source: Path, converter: Path) -> Path:
    """The tiny LFM2-VL, converted by llama.cpp's own converter, unless already current."""
    if _is_current(folder, LFM2_TAG):
        return folder
    import torch
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    tokenizer, marker = _tokenizer(vocab_source, LFM2_MARKERS)
    torch.manual_seed(SEED)
    config = Lfm2VlConfig(text_config={"model_type": "lfm2", **LFM2_TEXT, "vocab_size": len(tokenizer)},
                          vision_config={"model_type": "siglip2_vision_model", **LFM2_VISION},
                          image_token_id=marker["<image>"], projector_hidden_size=64, downsample_factor=2)
    model = Lfm2VlForConditionalGeneration(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # transformers 5 saves the tower's weights without the published `vision_model.` level, which
    # the converter expects and transformers reads back either way (its Siglip2VisionModel prefix)
    tower = "model.vision_tower."
    _rename_weights(folder, lambda name: name.replace(tower, f"{tower}vision_model.", 1))
    (folder / "preprocessor_config.json").write_text(json.dumps(LFM2_PROCESSOR, indent=2))
    return _converted(folder, converter, LFM2_TAG)


# InternVL3: transformers' own InternVL (an InternViT tower with layer scale and a class token, the
# pixel shuffle 2x2, a layer-normed GELU projection) on a 2-layer Qwen2, saved in the published
# -hf layout (model.vision_tower.*, as Intern-S1's, which the converter maps) and named for the
# converter as the remote-code checkpoints are (vision InternVisionModel, text Qwen2ForCausalLM);
# 4 tower blocks (the converter names the projector's mlp1.3 by block number), 112 px tiles of
# 8x8 patches (16 tokens a tile), the processor's published tiling (1-12 tiles and a thumbnail).
INTERNVL_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
                   "num_attention_heads": 2, "image_size": [112, 112], "patch_size": [14, 14],
                   "hidden_act": "gelu", "attention_bias": True, "layer_scale_init_value": 0.1,
                   "initializer_range": 0.2, "architectures": ["InternVisionModel"]}
INTERNVL_MARKERS = ("<img>", "</img>", "<IMG_CONTEXT>")
INTERNVL_TAG = "edgevlm parity checkpoint internvl v1"


def build_internvl(folder: Path, vocab_source: Path, converter: Path) -> Path:
    """The tiny InternVL3, converted by llama.cpp's own converter, unless already current."""
    if _is_current(folder, INTERNVL_TAG):
        return folder
    import torch
    from transformers import InternVLConfig, InternVLForConditionalGeneration
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    tokenizer, marker = _tokenizer(vocab_source, INTERNVL_MARKERS)
    torch.manual_seed(SEED)
    text = {key: value for key, value in TEXT.items() if key != "rope_scaling"}  # Qwen2's plain RoPE
    config = InternVLConfig(text_config={"model_type": "qwen2", **text, "vocab_size": len(tokenizer),
                                         "architectures": ["Qwen2ForCausalLM"]},
                            vision_config=INTERNVL_VISION, image_token_id=marker["<IMG_CONTEXT>"],
                            image_seq_length=16, downsample_ratio=0.5, tie_word_embeddings=True)
    model = InternVLForConditionalGeneration(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    published = ("vision_tower.", "multi_modal_projector.")
    _rename_weights(folder, lambda name: f"model.{name}" if name.startswith(published) else name)
    side = INTERNVL_VISION["image_size"][0]
    GotOcr2ImageProcessorPil(size={"height": side, "width": side}, crop_to_patches=True, min_patches=1,
                             max_patches=12, image_mean=[0.485, 0.456, 0.406],
                             image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
    return _converted(folder, converter, INTERNVL_TAG)


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    root = Path(__file__).resolve().parents[1]
    vocab_source = root / "models" / "test" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not vocab_source.exists():
        print(f"{vocab_source}: missing; run make test-models first", file=sys.stderr)
        return 2
    # llama.cpp's own converter, from the pinned sources (make parity-env unpacks them)
    converter = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    if converter is None or not converter.is_file():
        print(f"{converter or 'CONVERTER'}: missing; make parity-env unpacks llama.cpp's sources",
              file=sys.stderr)
        return 2
    print(build_qwen25vl(out / "qwen2.5-vl", vocab_source, converter))
    print(build_qwen2vl(out / "qwen2-vl", vocab_source, converter))
    print(build_qwen3vl(out / "qwen3-vl", vocab_source, converter))
    print(build_llava_next(out / "llava-next", vocab_source))
    print(build_llava15(out / "llava-1.5", vocab_source))
    transformers4 = Path(sys.executable).parents[1] / "transformers4"
    for name in ("llava-next", "llava-1.5"):
        print(build_legacy_mmproj(out / name, converter, transformers4) or f"{name}: no {transformers4}")
    print(build_gemma3(out / "gemma3", vocab_source, converter))
    print(build_smolvlm(out / "smolvlm", vocab_source, converter))
    print(build_smolvlm(out / "smolvlm-split", vocab_source, converter, longest=SMOLVLM_SPLIT_LONGEST))
    print(build_gemma4(out / "gemma4", converter))
    print(build_lfm2vl(out / "lfm2-vl", vocab_source, converter))
    print(build_internvl(out / "internvl", vocab_source, converter))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
