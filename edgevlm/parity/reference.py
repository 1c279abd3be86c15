"""transformers' side of a parity check, run in the reference venv (`make parity-env`):
`python -m edgevlm.parity.reference` reads one JSON request on stdin and writes one JSON answer
on stdout. The only module of edgevlm that imports transformers; nothing else of edgevlm is
imported here, so it runs wherever transformers does.

Stages (the request's "stage"):
- "resize": a family's image processor on each case's size and pixel limits, as its published
  preprocessor_config.json sets them. Request: {"family": "qwen-vl", "patch_size": 14, "merge": 2,
  "cases": [[w, h, min_pixels, max_pixels], ...], "images": N}. Answer: {"sizes": [[w, h], ...]},
  the size transformers' own rule gives each case, and {"processed": [[w, h], ...]}, the size
  the processor itself makes of a real image for the first N cases (its image_grid_thw), which
  shows the rule is what the processor runs.
- "resize" of "gemma4": the same for Gemma 4, each case [w, h, max_soft_tokens]; a size
  transformers refuses is null. "processed" holds the processor's own soft tokens for the first
  N cases (their budgets on its ladder of 70..1120).
- "tiles" of "smolvlm": the views transformers' SmolVLM processor cuts each [w, h] into (its
  tiles and the global view; 1 where it does not split), at {"longest": its size.longest_edge,
  "tile": its max_image_size.longest_edge}. Answer: {"views": [...]}.
- "tiles" of "lfm2": what transformers' LFM2-VL processor (at its published defaults: 512 px
  tiles, 64-256 tokens, 2-10 tiles) makes of an image of each [w, h]. Answer: {"results":
  [{"views": n, "tokens": visual tokens in all, "grid": [cols, rows]}, ...]}.
- "checkpoint": a checkpoint's own image processor, read from its folder ({"dir": …}) with
  AutoImageProcessor, on a synthetic image of each [w, h]. Answer: {"kind": "size", "results":
  [[w, h] or null, ...]} for Qwen-VL (null: refused), Gemma 3 and LLaVA-1.5 (their pixel_values' size),
  {"kind": "views", ...} for SmolVLM,
  {"kind": "canvas", "results": [{"canvas": [w, h], "tie": bool}, ...]} for LLaVA-NeXT,
  {"kind": "soft tokens", "results": [{"tokens": n, "budget": its max_soft_tokens} or null, ...]}
  for Gemma 4 (null: refused).
- "pixels": the pixels a processor hands the encoder, before rescaling and normalising (0..255),
  for each image file of {"images": [path, ...]}: "qwen-vl" at {"patch_size", "merge", "min_pixels",
  "max_pixels"}, un-patchified to the resized image; "llava" (LLaVA-1.5: padded to a square in the
  mean colour, then resized) at {"size": 336}. Answer: {"results": [{"shape": [h, w, 3],
  "pixels": base64 of the uint8 array}, ...]}.
- "rows" of "qwen-vl", "gemma3", "gemma4" or "smolvlm": the rows the vision tower and projector
  (Qwen's merger, Gemma's pooling, norm and projection) of the checkpoint in {"dir"} give each
  image file of {"images"} (its own processor, its own forward, float32), the processor called
  with {"processor": {...}} where given (Gemma 4's "max_soft_tokens"), or each image with its own
  of {"processors": [{...}, ...]}.
  Answer: {"results": [{"shape": [tokens, width], "rows": base64 of the float32 array}, ...]}.
- "rows" of "llava-next" (and "llava", LLaVA-1.5: its one padded view): each view's rows (the
  processor's overview and tiles, before packing) of each image file, at the checkpoint's feature
  layer; with {"class_token": "last"}, as llama.cpp's llava graph lays its tower's input out (the
  class token after the patches, positions in that order, the rows from the second on: llama.cpp
  #25814). Answer: {"results": [{"shape":
  [views, tokens, width], "rows": …}, ...]}.
- "logits" of "qwen-vl", "llava", "llava-next", "gemma3", "gemma4", "smolvlm" or "lfm2": the
  checkpoint in {"dir"} run on {"input_ids": [...]} with the image files of {"images"} in their
  image-token runs (none: a text prompt; an id of -1 is the model's own image token), processed
  with {"processor"} where given: the next-token logits and {"steps"} greedy tokens. With
  {"patch_0": "neighbour"} (LLaVA), each view's first patch has its neighbour's features, as
  edgevlm shows it on the pinned llama.cpp. With {"forced": [ids]} (edgevlm's greedy tokens),
  the prompt is read on with them too. Answer: {"logits": base64 float32, "greedy": [ids],
  "short_by": [how far below the reference's own best each forced token's logit is, on the same
  prefix]}.
- "prompt" of "qwen-vl": stage 2, the ids transformers' Qwen2.5-VL processor makes of each of
  {"conversations": [{"messages": [...], "images": [path, ...]}, ...]} with the chat template
  {"template"}, the tokenizer built from the GGUF {"gguf"}'s vocabulary and the image processor
  saved in {"dir"}: the template rendered with the generation prompt, each <|image_pad|>
  expanded to its image's tokens. Answer: {"results": [{"text": …, "input_ids": [...]}, ...]}.
  "prompt" of "gemma4": the same with Gemma 4's processor, its published image processor at
  {"max_soft_tokens", "patch_size", "merge"} (no checkpoint), each <|image|> expanded to
  <|image>, the image's soft tokens and <image|>. "prompt" of "smolvlm": SmolVLM's processor at
  {"longest", "tile", "image_seq_len"}, each <image> expanded to its tiles (row and column
  markers) and its global view. "prompt" of "gemma3": Gemma 3's processor with the image
  processor in {"dir"} and {"image_seq_length"} soft tokens an image; with {"blank_lines":
  false}, without the blank line it writes before and after each image. Every answer names
  {"image_token_id"}, the id an image's tokens have in its ids.
- "anyres": LLaVA-NeXT (1.6). Request: {"family": "llava-next", "pinpoints": [[a, b], ...] as
  the checkpoint's config lists them, "tile": 336, "side": 24, "cases": [[w, h], ...],
  "images": N}. Answer: {"canvases": [[w, h], ...]}, the canvas transformers picks
  (select_best_resolution, which reads each pair as height then width), {"maps": [[rows, cols],
  ...]}, the feature map the model keeps after unpad_image (modeling_llava_next.py), and
  {"views": [...]}, the views the processor itself cuts a real image into for the first N cases.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

Answer = dict[str, Any]


@contextlib.contextmanager
def _peak_activation(module: Any) -> Iterator[list[float]]:
    """The largest |value| any layer of `module` outputs while the block runs (hooks on every
    submodule): how near the vision tower comes to f16's range."""
    import torch

    peak = [0.0]

    def record(_module: Any, _inputs: Any, output: Any) -> None:
        for value in output if isinstance(output, (tuple, list)) else (output,):
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                peak[0] = max(peak[0], float(value.detach().abs().max()))

    hooks = [child.register_forward_hook(record) for child in module.modules()]
    try:
        yield peak
    finally:
        for hook in hooks:
            hook.remove()


def _qwen_vl_resize(request: dict[str, Any]) -> Answer:
    from PIL import Image
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as qwen2_vl

    patch, merge = int(request["patch_size"]), int(request["merge"])
    factor = patch * merge
    sizes = []
    for width, height, least, most in request["cases"]:
        resized_h, resized_w = qwen2_vl.smart_resize(height, width, factor=factor, min_pixels=least,
                                                     max_pixels=most)
        sizes.append([resized_w, resized_h])
    processed = []
    for width, height, least, most in request["cases"][: int(request.get("images", 0))]:
        processor = qwen2_vl.Qwen2VLImageProcessorPil(size={"shortest_edge": least, "longest_edge": most},
                                                      patch_size=patch, merge_size=merge)
        grid = processor(images=[Image.new("RGB", (width, height), (120, 80, 40))],
                         return_tensors="np")["image_grid_thw"][0]
        processed.append([int(grid[2]) * patch, int(grid[1]) * patch])
    return {"sizes": sizes, "processed": processed}


def _gemma4_resize(request: dict[str, Any]) -> Answer:
    from PIL import Image
    from transformers.models.gemma4 import image_processing_pil_gemma4 as gemma4

    patch, pool = int(request["patch_size"]), int(request["merge"])
    sizes: list[list[int] | None] = []
    for width, height, tokens in request["cases"]:
        try:
            resized_h, resized_w = gemma4.get_aspect_ratio_preserving_size(
                height, width, patch_size=patch, max_patches=tokens * pool * pool, pooling_kernel_size=pool)
            sizes.append([resized_w, resized_h])
        except ValueError:  # a strip whose one token a side is over the budget
            sizes.append(None)
    processed = []
    for width, height, tokens in request["cases"][: int(request.get("images", 0))]:
        processor = gemma4.Gemma4ImageProcessorPil(max_soft_tokens=tokens, patch_size=patch,
                                                   pooling_kernel_size=pool)
        out = processor(images=[Image.new("RGB", (width, height), (120, 80, 40))], return_tensors="np")
        processed.append(int(out["num_soft_tokens_per_image"][0]))
    return {"sizes": sizes, "processed": processed}


def _smolvlm_tiles(request: dict[str, Any]) -> Answer:
    from transformers.models.smolvlm import image_processing_pil_smolvlm as smolvlm

    processor = smolvlm.SmolVLMImageProcessorPil(size={"longest_edge": int(request["longest"])},
                                                 max_image_size={"longest_edge": int(request["tile"])})
    views = [processor.get_number_of_image_patches(height, width, {})[0] or 1
             for width, height in request["cases"]]
    return {"views": views}


def _internvl_tiles(request: dict[str, Any]) -> Answer:
    """The views InternVL's processor (GotOcr2's, as saved beside the checkpoint) makes of each
    size with each max_patches from 1 to its own (_views_by_max_patches)."""
    processor = _saved_processor(request)
    views = [_views_by_max_patches(processor, width, height) for width, height in request["cases"]]
    return {"views": views, "max_patches": processor.max_patches, "tile": processor.size["height"]}


def _views_by_max_patches(processor: Any, width: int, height: int) -> list[int]:
    """InternVL's views of a (w, h) image (its tiles and the thumbnail, or one view) with each
    max_patches from 1 to the processor's own."""
    return [processor.get_number_of_image_patches(height, width, {"max_patches": most})
            for most in range(1, processor.max_patches + 1)]


# Families whose processor runs on torchvision's transforms (the others' are the PIL ones).
TORCHVISION_FAMILIES = frozenset({"lfm2"})


def _torchvision_transforms() -> None:
    """torchvision as LFM2-VL's processor uses it: its image transforms, which are plain torch.

    The package index has only torchvision's CUDA build: `make parity-env` puts it in a folder of
    the venv's own, off the path, and it is put on the path (before transformers is imported, which
    looks for it once) for these families alone, so every other family keeps the PIL processor it
    was checked with. Beside CPU torch its native library does not load, and its import then fails
    registering shapes for operators (nms, roi_align) that library would have defined; the
    processor uses none of them, so that registration is skipped: anything that did use one would
    fail by name, not give another answer."""
    sys.path.insert(0, str(Path(sys.prefix) / "torchvision"))
    name = "torchvision._meta_registrations"
    sys.modules.setdefault(name, types.ModuleType(name))


def _lfm2_tiles(request: dict[str, Any]) -> Answer:
    from PIL import Image
    from transformers.models.lfm2_vl.image_processing_lfm2_vl import Lfm2VlImageProcessor

    processor = Lfm2VlImageProcessor()
    merge = processor.downsample_factor
    results = []
    for width, height in request["cases"]:
        out = processor(images=[Image.new("RGB", (width, height), (120, 80, 40))], return_tensors="pt",
                        return_row_col_info=True)
        results.append({"views": len(out["spatial_shapes"]), "tokens": _lfm2_tokens(out, merge),
                        "grid": [int(out["image_cols"][0]), int(out["image_rows"][0])]})
    return {"results": results}


def _lfm2_tokens(processed: Any, merge: int) -> int:
    """The visual tokens of every view LFM2-VL's processor made (its patches merged merge x merge)."""
    return sum((h // merge) * (w // merge) for h, w in processed["spatial_shapes"].tolist())


def _llava_next_anyres(request: dict[str, Any]) -> Answer:
    import torch
    from PIL import Image
    from transformers.image_processing_utils import select_best_resolution
    from transformers.models.llava_next import image_processing_pil_llava_next as llava_next
    from transformers.models.llava_next.modeling_llava_next import unpad_image

    pinpoints, tile, side = request["pinpoints"], int(request["tile"]), int(request["side"])
    canvases, maps = [], []
    for width, height in request["cases"]:
        canvas_h, canvas_w = select_best_resolution((height, width), pinpoints)
        grid = torch.zeros(1, canvas_h // tile * side, canvas_w // tile * side)
        kept = unpad_image(grid, (height, width))
        canvases.append([canvas_w, canvas_h])
        maps.append([int(kept.shape[1]), int(kept.shape[2])])
    processor = llava_next.LlavaNextImageProcessorPil(image_grid_pinpoints=pinpoints,
                                                      size={"shortest_edge": tile},
                                                      crop_size={"height": tile, "width": tile})
    views = []
    for width, height in request["cases"][: int(request.get("images", 0))]:
        pixels = processor(images=[Image.new("RGB", (width, height), (120, 80, 40))],
                           return_tensors="np")["pixel_values"]
        views.append(int(pixels.shape[1]))
    return {"canvases": canvases, "maps": maps, "views": views}


def _pixels(request: dict[str, Any]) -> Answer:
    import base64

    import numpy as np
    from PIL import Image

    plain = {"do_rescale": False, "do_normalize": False}
    if request["family"] == "llava":
        from transformers.models.llava import image_processing_pil_llava as llava

        side = int(request["size"])
        processor: Any = llava.LlavaImageProcessorPil(do_pad=True, size={"shortest_edge": side},
                                                      crop_size={"height": side, "width": side}, **plain)
    else:
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as qwen2_vl

        patch, merge = int(request["patch_size"]), int(request["merge"])
        processor = qwen2_vl.Qwen2VLImageProcessorPil(
            size={"shortest_edge": int(request["min_pixels"]), "longest_edge": int(request["max_pixels"])},
            patch_size=patch, merge_size=merge, **plain)
    results = []
    for path in request["images"]:
        out = processor(images=[Image.open(path).convert("RGB")], return_tensors="np")
        if request["family"] == "llava":
            chw = out["pixel_values"][0]
        else:  # undo the patchifying: (t, h/m, w/m, m, m, c, temporal, p, p) back to (c, h, w)
            grid_t, grid_h, grid_w = (int(v) for v in out["image_grid_thw"][0])
            temporal = processor.temporal_patch_size
            patches = out["pixel_values"].reshape(grid_t, grid_h // merge, grid_w // merge, merge, merge, 3,
                                                  temporal, patch, patch)
            chw = patches.transpose(0, 6, 5, 1, 3, 7, 2, 4, 8).reshape(
                grid_t * temporal, 3, grid_h * patch, grid_w * patch)[0]
        hwc = np.clip(np.rint(chw.transpose(1, 2, 0)), 0, 255).astype(np.uint8)
        results.append({"shape": list(hwc.shape), "pixels": base64.b64encode(hwc.tobytes()).decode()})
    return {"results": results}


def _saved_model(request: dict[str, Any]) -> Any:
    """The checkpoint in request["dir"], at f32, for inference."""
    import torch
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(request["dir"], local_files_only=True,
                                                       dtype=torch.float32).eval()


def _saved_processor(request: dict[str, Any]) -> Any:
    """The image processor saved beside the checkpoint in request["dir"]."""
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(request["dir"], local_files_only=True)


def _rows_answer(array: Any, peak: float) -> dict[str, Any]:
    """One image's rows (float32, base64) with the tower's peak activation."""
    import base64

    return {"shape": list(array.shape), "rows": base64.b64encode(array.tobytes()).decode(), "peak": peak}


def _rows(request: dict[str, Any]) -> Answer:

    import torch
    from PIL import Image

    model = _saved_model(request)
    processor = _saved_processor(request)
    results = []
    # the vision tower, by the name each family's model gives it
    tower = next(getattr(model.model, name) for name in ("visual", "vision_model", "vision_tower")
                 if hasattr(model.model, name))
    # the processor's arguments: one set for every image, or one an image (Gemma 4's budget)
    arguments = request.get("processors") or [request.get("processor", {})] * len(request["images"])
    for path, given in zip(request["images"], arguments, strict=True):
        out = processor(images=[Image.open(path).convert("RGB")], return_tensors="pt", **given)
        # Qwen-VL's size in patches; SmolVLM's mask of the pixels each view holds; Gemma 4's
        # patches' places; LFM2-VL's views' sizes in patches and their masks
        grid = [out[key] for key in ("image_grid_thw", "spatial_shapes", "pixel_attention_mask",
                                     "image_position_ids") if key in out]
        with torch.no_grad(), _peak_activation(tower) as peak:
            features = model.model.get_image_features(out["pixel_values"], *grid)
        # Qwen3-VL: its deepstack layers' rows beside the merger's, as mtmd hands them over
        deepstack = [layer[0] if isinstance(layer, (tuple, list)) else layer
                     for layer in getattr(features, "deepstack_features", None) or ()]
        pooled = features.pooler_output
        # a list of each image's (SmolVLM: each view's) rows, or one batch of them (InternVL: a
        # batch of the image's views, its tiles then the thumbnail)
        main = (torch.cat(list(pooled)) if isinstance(pooled, (list, tuple))
                else pooled.flatten(0, 1) if request["family"] == "internvl" else pooled[0])
        array = torch.cat([main, *deepstack], dim=-1).float().numpy()
        results.append(_rows_answer(array, peak[0]))
    return {"results": results}


def _llava_next_rows(request: dict[str, Any]) -> Answer:

    import torch
    from PIL import Image

    model = _saved_model(request)
    processor = _saved_processor(request)
    tower, project = model.model.vision_tower, model.model.multi_modal_projector
    layers = model.config.vision_config.num_hidden_layers + 1 + model.config.vision_feature_layer
    results = []
    for path in request["images"]:
        values = processor(images=[Image.open(path).convert("RGB")], return_tensors="pt")["pixel_values"]
        views = values[0] if values.dim() == 5 else values  # LLaVA-NeXT's views of an image; 1.5's one
        with torch.no_grad(), _peak_activation(tower) as peak:
            if request.get("class_token") == "last":
                patches = tower.embeddings.patch_embedding(views).flatten(2).transpose(1, 2)
                first = torch.cat([patches, tower.embeddings.class_embedding.expand(len(views), 1, -1)], 1)
                hidden = tower.pre_layrnorm(first + tower.embeddings.position_embedding.weight[None])
                for layer in tower.encoder.layers[:layers]:
                    out = layer(hidden, None)
                    hidden = out[0] if isinstance(out, tuple) else out
                features = hidden[:, 1:]
            else:
                features = tower(views, output_hidden_states=True).hidden_states[layers][:, 1:]
            array = project(features).float().numpy()
        results.append(_rows_answer(array, peak[0]))
    return {"results": results}


def _logits(request: dict[str, Any]) -> Answer:
    import base64

    import torch

    model = _saved_model(request)
    if request.get("patch_0") == "neighbour":
        _patch_0_as_neighbour(model)
    # edgevlm's greedy tokens after the prompt, where given: read on the same prefix too (below)
    forced = [int(token) for token in request.get("forced", [])]
    with torch.no_grad():
        # the logits at the prompt's end and after each forced token but the last
        inputs = _model_inputs(model, request, request["input_ids"] + forced[:-1])
        every = model(**inputs, logits_to_keep=max(len(forced), 1)).logits[0].float()
        logits = every[0].numpy()
        # how far each forced token falls short of the reference's own choice on the same prefix
        # (0 where they are one): a near tie, within the implementations' measured difference,
        # is told from a divergence by this (parity/check.py: answer_row)
        short_by = [float(every[k].max() - every[k, token]) for k, token in enumerate(forced)]
        steps = int(request.get("steps", 0))
        new: list[int] = []
        if steps:
            prompt = _model_inputs(model, request, request["input_ids"])
            greedy = model.generate(**prompt, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
            new = greedy[0, len(request["input_ids"]):].tolist()
    return {"logits": base64.b64encode(logits.tobytes()).decode(), "greedy": new, "short_by": short_by}


def _model_inputs(model: Any, request: dict[str, Any], input_ids: list[int]) -> dict[str, Any]:
    """The forward's inputs for these ids (an id of -1: the model's own image token) with the
    request's image files, processed as the request says."""
    import torch
    from PIL import Image

    # the model's own image token (Gemma 3 and LLaVA name it an index), where an id of -1 stands
    # for an image row (edgevlm parity's prompts)
    config = model.config
    named = getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None)
    image_token = int(named) if named is not None else -1
    ids = torch.tensor([input_ids])
    inputs: dict[str, Any] = {"input_ids": torch.where(ids == -1, image_token, ids)}
    if request.get("images"):
        processor = _saved_processor(request)
        images = [Image.open(path).convert("RGB") for path in request["images"]]
        # num_crops: Gemma 3's pan-and-scan count, which its forward does not take
        processed = processor(images=images, return_tensors="pt", **request.get("processor", {}))
        # num_soft_tokens_per_image: Gemma 4's count, which its forward does not take either;
        # num_patches: InternVL's views an image
        inputs |= {key: value for key, value in processed.items()
                   if key not in ("num_crops", "num_soft_tokens_per_image", "num_patches")}
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if request["family"] in ("qwen-vl", "gemma4"):
        # which tokens are an image's: transformers 5 places Qwen's M-RoPE positions by the grid,
        # and attends Gemma 4's image runs both ways (its 26B/31B setting), only where told (its
        # processor returns this beside the ids; without it all are text)
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == image_token).to(torch.int32)
    if request["family"] == "gemma3":
        # which tokens are an image's: Gemma 3 attends each image's run both ways (its mask is
        # built from these at the prefill, as its processor returns them), the rest causally
        inputs["token_type_ids"] = (inputs["input_ids"] == image_token).to(torch.int64)
    return inputs


def _patch_0_as_neighbour(model: Any) -> None:
    """LLaVA as edgevlm shows it on the pinned llama.cpp (llama.cpp #25814, corrected but for one
    row): each view's first patch given its right-hand neighbour's features. The projector works
    row by row, so its input's row is the output's."""

    def copy_neighbour(_module: Any, inputs: Sequence[Any]) -> tuple[Any, ...]:
        features = inputs[0].clone()
        features[:, 0] = features[:, 1]
        return (features, *inputs[1:])

    model.model.multi_modal_projector.register_forward_pre_hook(copy_neighbour)


def _gguf_tokenizer(path: str, **extra_special: str) -> Any:
    """The tokenizer a GGUF's vocabulary describes, in transformers, with its control tokens as
    special tokens (never split, as llama.cpp parses them): SmolLM's byte-level BPE (tokens and
    merges as written, each digit alone, then GPT-2's split: llama.cpp's "smollm"), or Gemma 4's
    SentencePiece-style BPE (llama.cpp's "gemma4": spaces written as U+2581, merges over each
    line's raw UTF-8, bytes it has no token for as <0xXX>)."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    reader = GGUFReader(path)

    def strings(key: str) -> list[str]:
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode() for i in field.data]

    def number(key: str) -> int:
        field = reader.fields[key]
        return int(field.parts[field.data[0]][0])

    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(field.parts[i][0]) for i in field.data]
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [(left, right) for left, right in (merge.split(" ", 1) for merge in merges)]
    kind = strings("tokenizer.ggml.model")
    if kind == ["gemma4"]:
        tokenizer = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=True,
                                         unk_token=tokens[number("tokenizer.ggml.unknown_token_id")]))
        tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[^\n]+|\n+"), "isolated")
        tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                               decoders.Fuse()])
    elif kind == ["gpt2"] and strings("tokenizer.ggml.pre") == ["smollm"]:
        tokenizer = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tokenizer.decoder = decoders.ByteLevel()
    else:
        raise ValueError(f"{path}: only SmolLM's byte-level BPE and Gemma 4's BPE are read here")
    control = 3  # llama_token_type CONTROL
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token, kind in zip(tokens, types, strict=True) if kind == control])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer,
                                   bos_token=tokens[number("tokenizer.ggml.bos_token_id")],
                                   eos_token=tokens[number("tokenizer.ggml.eos_token_id")],
                                   pad_token=tokens[number("tokenizer.ggml.padding_token_id")],
                                   extra_special_tokens=extra_special)


def _prompt(request: dict[str, Any]) -> Answer:
    """Stage 2: the ids transformers' processor makes of each conversation, its chat template
    rendered and each image's placeholder expanded to the image's tokens."""
    from PIL import Image
    from transformers import ProcessorMixin

    # The processors' video and audio halves need torchvision and torchaudio, which the CPU
    # reference venv leaves out (images use neither): their class check is skipped for them.
    check = ProcessorMixin.check_argument_for_proper_class
    ProcessorMixin.check_argument_for_proper_class = (
        lambda self, name, arg: None if arg is None else check(self, name, arg))
    processor = _PROMPT_PROCESSORS[request["family"]](request)
    results = []
    for conversation in request["conversations"]:
        images = [Image.open(path).convert("RGB") for path in conversation["images"]]
        text = processor.apply_chat_template(conversation["messages"], tokenize=False,
                                             add_generation_prompt=conversation.get("generation", True))
        ids = processor(text=[text], images=images or None)["input_ids"][0]
        results.append({"text": text, "input_ids": [int(i) for i in ids]})
    # the id each image row has in the ids: the tokenizer's image token where it names one (Gemma
    # 3's processor calls its <start_of_image> its image token, and expands it to rows of the
    # tokenizer's <image_soft_token>), else the processor's
    rows = getattr(processor.tokenizer, "image_token_id", None)
    return {"results": results, "image_token_id": int(rows if rows is not None else processor.image_token_id)}


def _qwen_vl_processor(request: dict[str, Any]) -> Any:
    """Qwen2-VL's or Qwen2.5-VL's processor, as the checkpoint in {"dir"} names its model."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor

    model_type = json.loads((Path(request["dir"]) / "config.json").read_text())["model_type"]
    kind = Qwen2VLProcessor if model_type == "qwen2_vl" else Qwen2_5_VLProcessor
    return kind(image_processor=_saved_processor(request), tokenizer=_gguf_tokenizer(request["gguf"]),
                video_processor=None, chat_template=request["template"])


def _gemma3_processor(request: dict[str, Any]) -> Any:
    """Gemma 3's processor with the image processor saved in {"dir"} and {"image_seq_length"}
    soft tokens an image: each <start_of_image> becomes a blank line, <start_of_image>, the soft
    tokens, <end_of_image> and a blank line."""
    from transformers import Gemma3Processor

    tokenizer = _gguf_tokenizer(request["gguf"], image_token="<image_soft_token>",
                                boi_token="<start_of_image>", eoi_token="<end_of_image>")
    processor = Gemma3Processor(image_processor=_saved_processor(request), tokenizer=tokenizer,
                                chat_template=request["template"],
                                image_seq_length=int(request["image_seq_length"]))
    if not request.get("blank_lines", True):  # the image as mtmd lays it out, its markers alone
        processor.full_image_sequence = processor.full_image_sequence.strip("\n")
    return processor


def _gemma4_processor(request: dict[str, Any]) -> Any:
    """Gemma 4's processor with the published image processor at {"max_soft_tokens"} (its budget
    for each image), the projector's {"patch_size"} and {"merge"} (the pooling kernel)."""
    from transformers import Gemma4Processor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    images = Gemma4ImageProcessorPil(max_soft_tokens=int(request["max_soft_tokens"]),
                                     patch_size=int(request["patch_size"]),
                                     pooling_kernel_size=int(request["merge"]))
    # Audio's markers too, though no audio is asked for: transformers 5.25's validate_inputs
    # refuses any input where they are missing (an `and`/`or` precedence slip). They are added
    # past the vocabulary and never appear in a prompt.
    tokenizer = _gguf_tokenizer(request["gguf"], image_token="<|image|>", boi_token="<|image>",
                                eoi_token="<image|>", audio_token="<|audio|>", boa_token="<|audio>",
                                eoa_token="<audio|>")
    return Gemma4Processor(feature_extractor=None, image_processor=images, tokenizer=tokenizer,
                           video_processor=None, chat_template=request["template"],
                           image_seq_length=int(request["max_soft_tokens"]))


def _smolvlm_processor(request: dict[str, Any]) -> Any:
    """SmolVLM's processor with its image processor at {"longest"} (size.longest_edge) and
    {"tile"} (max_image_size.longest_edge), {"image_seq_len"} tokens a tile, and SmolVLM's
    markers (<image> added past the test vocabulary, which has none: the image's rows are what
    stand there, and the answer names its id)."""
    from transformers import SmolVLMProcessor
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    images = SmolVLMImageProcessorPil(size={"longest_edge": int(request["longest"])},
                                      max_image_size={"longest_edge": int(request["tile"])})
    tokenizer = _gguf_tokenizer(request["gguf"], image_token="<image>", global_image_token="<global-img>",
                                fake_image_token="<fake_token_around_image>",
                                end_of_utterance_token="<end_of_utterance>")
    processor = SmolVLMProcessor(image_processor=images, tokenizer=tokenizer, video_processor=None,
                                 image_seq_len=int(request["image_seq_len"]),
                                 chat_template=request["template"])
    # its chat template step asks the (absent) video processor for its frame defaults
    processor.video_processor = types.SimpleNamespace(num_frames=None, fps=None)
    return processor


_PROMPT_PROCESSORS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "qwen-vl": _qwen_vl_processor, "gemma4": _gemma4_processor, "smolvlm": _smolvlm_processor,
    "gemma3": _gemma3_processor}


def _checkpoint(request: dict[str, Any]) -> Answer:
    from PIL import Image
    from transformers.image_processing_utils import select_best_resolution

    processor = _saved_processor(request)
    family, results = request["family"], []
    for width, height in request["cases"]:
        if family == "smolvlm":
            results.append(processor.get_number_of_image_patches(height, width, {})[0] or 1)
        elif family == "internvl":  # its views with each max_patches up to its own
            results.append(_views_by_max_patches(processor, width, height))
        elif family in ("gemma3", "llava"):  # the size its processor hands the tower (LLaVA-1.5:
            # the photo padded to its square; Gemma 3: stretched to it)
            pixels = processor(images=[Image.new("RGB", (width, height), (120, 80, 40))],
                               return_tensors="np")["pixel_values"]
            results.append([int(pixels.shape[-1]), int(pixels.shape[-2])])
        elif family == "gemma4":  # the soft tokens it scales the image to, at its own budget
            try:
                image = Image.new("RGB", (width, height), (120, 80, 40))
                out = processor(images=[image], return_tensors="np")
                results.append({"tokens": int(out["num_soft_tokens_per_image"][0]),
                                "budget": int(processor.max_soft_tokens)})
            except ValueError:  # a strip whose one token a side is over the budget
                results.append(None)
        elif family == "lfm2":  # the visual tokens of every view it makes (tiles and thumbnail)
            out = processor(images=[Image.new("RGB", (width, height), (120, 80, 40))], return_tensors="pt")
            results.append(_lfm2_tokens(out, processor.downsample_factor))
        elif family == "llava-next":
            pinpoints = processor.image_grid_pinpoints
            canvas_h, canvas_w = select_best_resolution((height, width), pinpoints)
            other = select_best_resolution((height, width), [[b, a] for a, b in pinpoints])
            results.append({"canvas": [canvas_w, canvas_h], "tie": tuple(other) != (canvas_h, canvas_w)})
        else:
            try:
                grid = processor(images=[Image.new("RGB", (width, height), (120, 80, 40))],
                                 return_tensors="np")["image_grid_thw"][0]
                results.append([int(grid[2]) * processor.patch_size, int(grid[1]) * processor.patch_size])
            except ValueError:  # an aspect ratio over 200
                results.append(None)
    kinds = {"smolvlm": "views", "llava-next": "canvas", "lfm2": "tokens", "gemma4": "soft tokens",
             "internvl": "views by max_patches"}
    return {"kind": kinds.get(family, "size"), "results": results}


STAGES: dict[tuple[str, str], Callable[[dict[str, Any]], Answer]] = {
    ("resize", "qwen-vl"): _qwen_vl_resize,
    ("resize", "gemma4"): _gemma4_resize,
    ("tiles", "smolvlm"): _smolvlm_tiles,
    ("tiles", "lfm2"): _lfm2_tiles,
    ("tiles", "internvl"): _internvl_tiles,
    ("anyres", "llava-next"): _llava_next_anyres,
    ("pixels", "qwen-vl"): _pixels,
    ("pixels", "llava"): _pixels,
    ("rows", "qwen-vl"): _rows,
    ("logits", "qwen-vl"): _logits,
    ("prompt", "qwen-vl"): _prompt,
    ("prompt", "gemma4"): _prompt,
    ("prompt", "smolvlm"): _prompt,
    ("prompt", "gemma3"): _prompt,
    ("logits", "llava-next"): _logits,
    ("rows", "gemma3"): _rows,
    ("rows", "smolvlm"): _rows,
    ("rows", "lfm2"): _rows,
    ("logits", "lfm2"): _logits,
    ("logits", "gemma3"): _logits,
    ("rows", "gemma4"): _rows,
    ("logits", "gemma4"): _logits,
    ("logits", "smolvlm"): _logits,
    ("rows", "internvl"): _rows,
    ("logits", "internvl"): _logits,
    ("rows", "llava-next"): _llava_next_rows,
    ("rows", "llava"): _llava_next_rows,
    ("logits", "llava"): _logits,
    ("checkpoint", "qwen-vl"): _checkpoint,
    ("checkpoint", "smolvlm"): _checkpoint,
    ("checkpoint", "llava-next"): _checkpoint,
    ("checkpoint", "llava"): _checkpoint,
    ("checkpoint", "gemma3"): _checkpoint,
    ("checkpoint", "lfm2"): _checkpoint,
    ("checkpoint", "gemma4"): _checkpoint,
    ("checkpoint", "internvl"): _checkpoint,
}


def main() -> int:
    request = json.load(sys.stdin)
    handler = STAGES.get((request.get("stage", ""), request.get("family", "")))
    if handler is None:
        json.dump({"error": f"no reference for stage {request.get('stage')!r} of {request.get('family')!r}"},
                  sys.stdout)
        return 2
    if request.get("family") in TORCHVISION_FAMILIES:
        _torchvision_transforms()
    import transformers

    answer = handler(request)
    answer["transformers"] = transformers.__version__
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
