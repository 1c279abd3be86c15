"""Facts read from GGUF files with the `gguf` package: what the planner and the engine need."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from edgevlm.errors import ModelError
from edgevlm.models.memory_kinds import Attention, Hybrid, MemoryKind, Recurrent, SlidingWindow
from edgevlm.paths import cache_dir
from edgevlm.store.files import write_atomically

if TYPE_CHECKING:  # gguf and numpy are imported when a file is read, not at start-up
    import numpy as np
    from gguf import GGUFReader

GGUF_MAGIC = b"GGUF"
GGUF_BOOL = 7  # gguf_type's GGUF_TYPE_BOOL
# clip.cpp's flags for the vision MLP's activation (neither set: GELU-quick)
ACTIVATION_KEYS = {"gelu": "clip.use_gelu", "silu": "clip.use_silu"}
PROJECTOR_ARCH = "clip"
# Decoder architectures edgevlm has prompt formats and memory rules for.
SUPPORTED_TEXT_ARCHS = frozenset({"llama", "mistral", "qwen2", "gemma", "phi3", "granite",
                                  "qwen2vl", "qwen3vl", "qwen3", "gemma3", "gemma4", "lfm2"})
# Architectures whose layers keep a recurrent state (some or all): their cache cannot be cut at a
# position, so the ledger goes back through checkpoints (chat/checkpoints.py).
HYBRID_ARCHS = frozenset({"lfm2", "lfm2moe", "granitehybrid", "nemotron_h", "falcon_h1", "jamba", "qwen35",
                          "qwen3next", "plamo2"})
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv7", "arwkv7", "rwkv6qwen2"})
# Architectures whose sliding window llama.cpp honours, and which of their layers use it where the
# GGUF does not say: every n-th layer global, the rest windowed (llama_model_gemma3's pattern of
# 6; Gemma 4's files always list it, one flag a layer). Others' `sliding_window` keys are ignored
# by llama.cpp (Phi-3's, Qwen2's), and so here.
SWA_PATTERN_DEFAULT: dict[str, int | None] = {"gemma3": 6, "gemma4": None}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
# Bump when the facts' fields change, so stale cache entries are ignored.
_CACHE_VERSION = 16
IMAGE_NEWLINE_TENSOR = "model.image_newline"
CLASS_EMBEDDING_TENSOR = "v.class_embd"
POSITION_TENSOR = "v.position_embd.weight"
# Set in a projector copy whose position rows edgevlm rolled (ProjectorRepair.roll_positions).
ROLLED_KEY = "edgevlm.vision.positions_rolled"
# The tower layer(s) a LLaVA-style projector reads (llama.cpp's legacy converter writes it only
# where the vision config names its select layer)
FEATURE_LAYER_KEY = "clip.vision.feature_layer"
GGUF_INT32, GGUF_ARRAY = 5, 9  # gguf_type's GGUF_TYPE_INT32 and GGUF_TYPE_ARRAY
_Facts = TypeVar("_Facts", "TextModelFacts", "ProjectorFacts")


@dataclass(frozen=True)
class KvLayerShape:
    """One attention layer's cache, per cell: its KV heads and their K and V widths."""

    n_head_kv: int
    head_dim_k: int
    head_dim_v: int


@dataclass(frozen=True)
class TextModelFacts:
    """Architecture and tensor sizes of a text model GGUF."""

    path: Path
    architecture: str
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_ctx_train: int
    n_vocab: int
    chat_template: str | None
    layer_bytes: tuple[int, ...]
    output_bytes: int  # the output layer's own tensors (output.weight unless tied, output_norm)
    token_embd_bytes: int
    file_bytes: int
    tied_embeddings: bool = False  # no output.weight: the output layer reuses token_embd
    bos_text: str = ""  # the BOS and EOS tokens' text, as the chat template names them
    eos_text: str = ""
    n_kv_layers: int = 0  # layers with a KV cache (0: every layer; hybrids have fewer)
    n_swa: int = 0  # the sliding window, in tokens (0: none)
    n_swa_layers: int = 0  # layers that attend only within it (their cache can be a window's worth)
    # The windowed layers' heads where they differ from the global layers' (Gemma 4: 256-wide
    # heads in the window, 512-wide global ones); None: the same
    swa_shape: KvLayerShape | None = None
    # The last layers that reuse an earlier layer's KV and keep none of their own (Gemma 4 E2B/E4B)
    n_shared_kv_layers: int = 0
    recurrent_state_bytes: int = 0  # one sequence's recurrent state (f32), where edgevlm knows its shape
    # The ggml type most of the blocks' bytes are stored in ("F32", "F16", "Q4_K", …; "" unread)
    weight_type: str = ""

    @property
    def memory(self) -> MemoryKind:
        """What the model keeps per sequence (the one classifier; see models/memory_kinds.py)."""
        if self.architecture in RECURRENT_ARCHS:
            return Recurrent(self.recurrent_state_bytes)
        if self.architecture in HYBRID_ARCHS or 0 < self.n_kv_layers < self.n_layer:
            return Hybrid(self.recurrent_state_bytes)
        if self.n_swa:
            return SlidingWindow(self.n_swa, self.n_swa_layers, self.n_layer, self.n_shared_kv_layers)
        return Attention()

    @property
    def kv_layers(self) -> int:
        """Layers that hold attention KV of their own."""
        return (self.n_kv_layers or self.n_layer) - self.n_shared_kv_layers

    @property
    def global_shape(self) -> KvLayerShape:
        """The global (not windowed) attention layers' cache shape."""
        return KvLayerShape(self.n_head_kv, self.head_dim_k, self.head_dim_v)

    @property
    def window_shape(self) -> KvLayerShape:
        """The windowed layers' cache shape."""
        return self.swa_shape or self.global_shape

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes + self.token_embd_bytes


@dataclass(frozen=True)
class ProjectorFacts:
    """Shape and size of a multimodal projector (mmproj) GGUF."""

    path: Path
    projector_type: str
    image_size: int
    patch_size: int
    vision_width: int
    vision_heads: int
    vision_blocks: int
    vision_ff: int
    projection_dim: int
    weight_bytes: int
    file_bytes: int
    # LLaVA-1.6 (NeXT) projectors: the canvases its AnyRes may pick, (width, height) each, and how
    # tile features are merged ("spatial_unpad": unpadded, a newline vector after each row).
    grid_pinpoints: tuple[tuple[int, int], ...] = ()
    merge_type: str = "flat"
    has_image_newline: bool = False
    # Patches merged per side into one token (Qwen-VL 2, Gemma 3 4); 0 where the GGUF does not
    # say, and the projector's family completes it (families.read_projector)
    merge: int = 1
    window_attention: bool = False  # Qwen2.5-VL's windowed blocks: a full patch-by-patch mask
    # The longest side an image is resized to before it is cut into tiles (SmolVLM's
    # clip.vision.preproc_image_size, transformers' size.longest_edge); 0 where the GGUF has none.
    preproc_size: int = 0
    # The vision MLP's activation as the file names it (clip.use_gelu, clip.use_silu); "" where it
    # names none, and clip.cpp then runs GELU-quick (x * sigmoid(1.702 x))
    activation: str = ""
    # Blocks whose features also feed the text model's deepstack layers (Qwen3-VL): each image row
    # then holds the merger's and theirs, (1 + this) times the projection wide
    deepstack_layers: int = 0
    # A CLIP tower with a class token (v.class_embd: LLaVA's), and whether this file is edgevlm's
    # copy with its position rows rolled for llama.cpp's class-token-last graph (ROLLED_KEY)
    class_token: bool = False
    positions_rolled: bool = False
    # The least and most tiles an image is cut into (clip.vision.preproc_min_tiles and _max_tiles:
    # InternVL's min/max_dynamic_patch); 0 where the GGUF does not say (clip.cpp's default applies)
    preproc_tiles: tuple[int, int] = (0, 0)
    # The tower's layers whose output the projector takes (clip.vision.feature_layer: 0 the input,
    # N the N-th block's output); empty where the file names none, and clip.cpp then runs all but
    # the last stored block (FEATURE_LAYER_KEY)
    feature_layers: tuple[int, ...] = ()

    @property
    def tokens_per_image(self) -> int:
        """Tokens of one image at the projector's own size (a fixed-size family's every image)."""
        return (self.image_size // self.patch_size // max(self.merge, 1)) ** 2


def read_text_model(path: str | Path) -> TextModelFacts:
    """Read a text model's facts (cached by path, size and mtime); wrong kinds are ModelErrors."""
    return _cached(Path(path), TextModelFacts, _read_text_model)


def read_projector(path: str | Path) -> ProjectorFacts:
    """Read an mmproj's facts (cached by path, size and mtime); wrong kinds are ModelErrors."""
    return _cached(Path(path), ProjectorFacts, _read_projector)


def _read_text_model(path: Path) -> TextModelFacts:
    reader = _open(path, role="--model")
    fields = _fields(reader)
    arch = str(fields.get("general.architecture", ""))
    if arch == PROJECTOR_ARCH:
        raise ModelError(f"{path}: is a vision projector (mmproj), not a text model; pass it as --mmproj")
    if arch not in SUPPORTED_TEXT_ARCHS:
        raise ModelError(f"{path}: architecture '{arch or 'unknown'}' is not supported; "
                         f"supported: {', '.join(sorted(SUPPORTED_TEXT_ARCHS))}")
    try:
        n_embd = int(fields[f"{arch}.embedding_length"])
        n_head = int(fields[f"{arch}.attention.head_count"])
        n_layer = int(fields[f"{arch}.block_count"])
    except KeyError as exc:
        raise ModelError(f"{path}: GGUF lacks the key {exc.args[0]}; is it a complete text model?") from None
    heads_kv = fields.get(f"{arch}.attention.head_count_kv", n_head)
    listed = isinstance(heads_kv, (list, tuple))
    per_layer = [int(h) for h in heads_kv] if listed else [int(heads_kv)] * n_layer
    tokens = fields.get("tokenizer.ggml.tokens")
    n_vocab = int(fields.get(f"{arch}.vocab_size", len(tokens) if tokens is not None else 0))

    sizes = _tensor_sizes(reader, n_layer)
    template = fields.get("tokenizer.chat_template")
    return TextModelFacts(
        path=path,
        architecture=arch,
        name=str(fields.get("general.name", path.stem)),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        **_attention_layers(fields, arch, per_layer, n_embd // n_head),
        n_ff=int(fields.get(f"{arch}.feed_forward_length", 0)),
        n_ctx_train=int(fields.get(f"{arch}.context_length", 2048)),
        n_vocab=n_vocab,
        chat_template=str(template) if template else None,
        layer_bytes=sizes.layer_bytes,
        output_bytes=sizes.output_bytes,
        token_embd_bytes=sizes.token_embd_bytes,
        file_bytes=path.stat().st_size,
        tied_embeddings=not sizes.has_output_weight,
        weight_type=sizes.weight_type,
        n_kv_layers=sum(1 for h in per_layer if h),
        recurrent_state_bytes=_recurrent_state_bytes(fields, arch, n_embd, per_layer.count(0)),
        bos_text=_token_text(reader, "bos"),
        eos_text=_token_text(reader, "eos"),
    )


def _attention_layers(fields: dict[str, Any], arch: str, heads_kv: list[int],
                      head_dim: int) -> dict[str, Any]:
    """The attention layers' facts: the global layers' heads, the windowed layers' (where they
    differ), the window, and the last layers that share earlier layers' KV."""
    shared = int(fields.get(f"{arch}.attention.shared_kv_layers", 0))
    window = _sliding_window(fields, arch, heads_kv[:len(heads_kv) - shared])
    whole, windowed = _kv_shapes(fields, arch, heads_kv, window.pop("windowed"), head_dim)
    return {"n_head_kv": whole.n_head_kv, "head_dim_k": whole.head_dim_k, "head_dim_v": whole.head_dim_v,
            "swa_shape": windowed if windowed != whole else None, "n_shared_kv_layers": shared, **window}


def _sliding_window(fields: dict[str, Any], arch: str, heads_kv: list[int]) -> dict[str, Any]:
    """n_swa, the window llama.cpp applies in tokens, n_swa_layers, how many of the layers with a
    cache of their own (`heads_kv`) it applies to (as llama_hparams::set_swa_pattern counts them),
    and which ones ("windowed"); none where llama.cpp applies none."""
    n_swa = int(fields.get(f"{arch}.attention.sliding_window", 0))
    if n_swa <= 0 or (arch not in SWA_PATTERN_DEFAULT and arch not in HYBRID_ARCHS):
        return {"windowed": [False] * len(heads_kv)}
    if arch in HYBRID_ARCHS:  # LFM2 with a window: every attention layer uses it
        windowed = [bool(h) for h in heads_kv]
    else:
        pattern = fields.get(f"{arch}.attention.sliding_window_pattern", SWA_PATTERN_DEFAULT[arch])
        if isinstance(pattern, (list, tuple)):
            windowed = [bool(flag) for flag in pattern[:len(heads_kv)]]
        elif pattern is None:  # an architecture that lists it, in a file that does not: none
            windowed = [False] * len(heads_kv)
        else:
            every = int(pattern)
            windowed = [every == 0 or il % every < every - 1 for il in range(len(heads_kv))]
    return {"n_swa": n_swa, "n_swa_layers": sum(windowed), "windowed": windowed}


def _kv_shapes(fields: dict[str, Any], arch: str, heads_kv: list[int], windowed: list[bool],
               head_dim: int) -> tuple[KvLayerShape, KvLayerShape]:
    """The global and the windowed layers' cache shapes (llama_hparams::n_embd_k_gqa(il)): their
    KV heads (the most on any such layer; hybrids list 0 on recurrent layers) and head widths
    (key_length_swa where the file gives the windowed layers their own)."""
    k = int(fields.get(f"{arch}.attention.key_length", head_dim))
    v = int(fields.get(f"{arch}.attention.value_length", head_dim))
    k_swa = int(fields.get(f"{arch}.attention.key_length_swa", k))
    v_swa = int(fields.get(f"{arch}.attention.value_length_swa", v))
    in_window = [h for h, w in zip(heads_kv, windowed, strict=False) if w]
    outside = [h for h, w in zip(heads_kv, windowed + [False] * len(heads_kv), strict=False) if not w]
    heads = max(outside or heads_kv)
    return KvLayerShape(heads, k, v), KvLayerShape(max(in_window or [heads]), k_swa, v_swa)


def _recurrent_state_bytes(fields: dict[str, Any], arch: str, n_embd: int, n_recurrent: int) -> int:
    """One sequence's recurrent state, f32, as llama.cpp sizes it: LFM2's short convolutions keep
    (l_cache - 1) x n_embd per layer (llama_hparams::n_embd_r). 0 where edgevlm does not know it."""
    l_cache = int(fields.get(f"{arch}.shortconv.l_cache", 0))
    return 4 * n_recurrent * n_embd * (l_cache - 1) if l_cache > 1 else 0


def _token_text(reader: GGUFReader, which: str) -> str:
    """The text of the vocabulary's BOS or EOS token ("" where the GGUF names none)."""
    id_field = reader.fields.get(f"tokenizer.ggml.{which}_token_id")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if id_field is None or tokens is None:
        return ""
    token_id = int(id_field.contents())
    if not 0 <= token_id < len(tokens.data):
        return ""
    return bytes(tokens.parts[tokens.data[token_id]]).decode("utf-8", "replace")


@dataclass(frozen=True)
class _TensorSizes:
    layer_bytes: tuple[int, ...]
    output_bytes: int
    token_embd_bytes: int
    has_output_weight: bool
    weight_type: str


def _tensor_sizes(reader: GGUFReader, n_layer: int) -> _TensorSizes:
    """Bytes per block, of the output layer and of token_embd, from the tensor table."""
    layer_bytes = [0] * n_layer
    output_bytes = token_embd_bytes = 0
    has_output_weight = False
    by_type: dict[str, int] = {}
    for tensor in reader.tensors:
        size = int(tensor.n_bytes)
        match = _LAYER_RE.match(tensor.name)
        if match and int(match.group(1)) < n_layer:
            layer_bytes[int(match.group(1))] += size
            kind = tensor.tensor_type.name
            by_type[kind] = by_type.get(kind, 0) + size
        elif tensor.name == "token_embd.weight":
            token_embd_bytes = size
        elif tensor.name.startswith("output"):
            output_bytes += size
            has_output_weight |= tensor.name == "output.weight"
    weight_type = max(by_type, key=lambda kind: by_type[kind]) if by_type else ""
    return _TensorSizes(tuple(layer_bytes), output_bytes, token_embd_bytes, has_output_weight, weight_type)


def _read_projector(path: Path) -> ProjectorFacts:
    reader = _open(path, role="--mmproj")
    fields = _fields(reader)
    arch = str(fields.get("general.architecture", ""))
    if arch != PROJECTOR_ARCH:
        raise ModelError(f"{path}: is a text model ({arch or 'unknown'}), not a vision projector; "
                         "pass it as --model and give the mmproj file as --mmproj")
    if not fields.get("clip.has_vision_encoder", False):
        raise ModelError(f"{path}: this projector has no vision encoder")
    tensors = {t.name: t for t in reader.tensors}
    try:
        image_size = int(fields["clip.vision.image_size"])
        patch_size = int(fields["clip.vision.patch_size"])
    except KeyError as exc:
        raise ModelError(f"{path}: projector lacks the key {exc.args[0]}") from None
    return ProjectorFacts(
        path=path,
        # a file with vision and audio encoders names each one's type (clip.vision.projector_type:
        # Gemma 4's, as llama.cpp's converter writes it), as clip.cpp reads them
        projector_type=str(fields.get("clip.projector_type") or fields.get("clip.vision.projector_type")
                           or "mlp"),
        image_size=image_size,
        patch_size=patch_size,
        vision_width=int(fields.get("clip.vision.embedding_length", 0)),
        vision_heads=int(fields.get("clip.vision.attention.head_count", 0)),
        vision_blocks=int(fields.get("clip.vision.block_count", 0)),
        vision_ff=int(fields.get("clip.vision.feed_forward_length", 0)),
        projection_dim=_projection_width(tensors, fields),
        weight_bytes=sum(int(t.n_bytes) for t in reader.tensors),
        file_bytes=path.stat().st_size,
        grid_pinpoints=_pinpoints(fields.get("clip.vision.image_grid_pinpoints")),
        merge_type=str(fields.get("clip.vision.mm_patch_merge_type", "flat")),
        has_image_newline=IMAGE_NEWLINE_TENSOR in tensors,
        merge=_merge(fields),
        window_attention=int(fields.get("clip.vision.n_wa_pattern", 0)) > 0,
        preproc_size=int(fields.get("clip.vision.preproc_image_size", 0)),
        activation=next((name for name, key in ACTIVATION_KEYS.items() if fields.get(key)), ""),
        # clip.cpp loads a deepstack merger for each block that has one (v.deepstack.N.*)
        deepstack_layers=len({name.split(".")[2] for name in tensors if name.startswith("v.deepstack.")}),
        class_token=CLASS_EMBEDDING_TENSOR in tensors,
        positions_rolled=bool(fields.get(ROLLED_KEY, False)),
        preproc_tiles=(int(fields.get("clip.vision.preproc_min_tiles", 0)),
                       int(fields.get("clip.vision.preproc_max_tiles", 0))),
        feature_layers=tuple(int(v) for v in fields.get(FEATURE_LAYER_KEY, ()) or ()),
    )


@dataclass(frozen=True)
class ProjectorRepair:
    """What a projector file needs changed to run as its model was trained, on the pinned
    llama.cpp: boolean keys its converter left out (`flags`), its position embedding's rows
    rolled by one (`roll_positions`: llama.cpp's llava graph puts the class token last), and the
    tower layer it reads named where the file names none (`feature_layer`, 0 for none: llama.cpp's
    llava graph otherwise runs one stored block fewer)."""

    flags: tuple[str, ...] = ()
    roll_positions: bool = False
    feature_layer: int = 0

    def __bool__(self) -> bool:
        return bool(self.flags) or self.roll_positions or self.feature_layer > 0

    def describe(self) -> str:
        """Why the file needs a copy, for the log line."""
        parts = [f"names no {' or '.join(self.flags)}, which its model needs (llama.cpp's converter "
                 "leaves it out, and clip.cpp would run another activation)"] if self.flags else []
        if self.roll_positions:
            parts.append("would be run with each patch at its neighbour's position (llama.cpp #25814)")
        if self.feature_layer:
            parts.append(f"names no feature layer, and would be run one block short of its "
                         f"{self.feature_layer} (llama.cpp #25817)")
        return "; ".join(parts)


def write_repaired(source: Path, repair: ProjectorRepair, dest: Path) -> None:
    """A copy of a GGUF with `repair` made: each flag added as a key set true (and ROLLED_KEY where
    the position rows are rolled; FEATURE_LAYER_KEY where a layer is named), its tensor table as
    it was, its data as it was but for the position tensor's rows, the first moved to the end.
    The keys go in the header and the data section keeps its alignment, so the tensors' offsets,
    which count from it, hold. The data is streamed from the file's map, never read whole."""
    import struct

    reader = _open(source, role="--mmproj")
    keys = (*repair.flags, *((ROLLED_KEY,) if repair.roll_positions else ()))
    named = (FEATURE_LAYER_KEY,) if repair.feature_layer else ()
    present = {*keys, *named} & set(reader.fields)
    if present:
        raise ModelError(f"{source}: already has {', '.join(sorted(present))}")
    data = reader.data
    # the header: magic, version, tensor count (8 bytes), key count (8 bytes), then the keys
    keys_end = int(reader.tensors[0].field.offset) if reader.tensors else int(reader.data_offset)
    last = reader.tensors[-1].field if reader.tensors else None
    table_end = (int(last.offset) + sum(part.nbytes for part in last.parts)) if last else keys_end
    (n_kv,) = struct.unpack_from("<Q", bytes(data[16:24]))
    added = b"".join(struct.pack("<Q", len(key.encode())) + key.encode() + struct.pack("<IB", GGUF_BOOL, 1)
                     for key in keys)
    layer = struct.pack("<IIQi", GGUF_ARRAY, GGUF_INT32, 1, repair.feature_layer)  # an array of one
    added += b"".join(struct.pack("<Q", len(key.encode())) + key.encode() + layer for key in named)
    n_added = len(keys) + len(named)
    head = bytes(data[:16]) + struct.pack("<Q", n_kv + n_added) + bytes(data[24:keys_end]) + added
    table = bytes(data[keys_end:table_end])
    padding = b"\0" * (-(len(head) + len(table)) % int(reader.alignment))
    start = int(reader.data_offset)
    pieces: list[Any] = [data[start:].data]  # a view of the map
    if repair.roll_positions:
        tensor = next((t for t in reader.tensors if t.name == POSITION_TENSOR), None)
        if tensor is None:
            raise ModelError(f"{source}: has no {POSITION_TENSOR} to reorder")
        # rows are whole in every ggml type (a quantised block never spans two), so moving row
        # bytes moves rows; a GGUF shape lists the row's width first, then the rows
        begin, size = int(tensor.data_offset), int(tensor.n_bytes)
        row = size // int(tensor.shape[-1])
        rows = bytes(data[begin:begin + size])
        pieces = [data[start:begin].data, rows[row:] + rows[:row], data[begin + size:].data]
    write_atomically(dest, [head, table, padding, *pieces], durable=False, mode=0o644)


def _merge(fields: dict[str, Any]) -> int:
    """The merge the GGUF states, or 0 (its family's default then applies)."""
    for key in ("clip.vision.spatial_merge_size", "clip.vision.projector.scale_factor"):
        if key in fields:
            return int(fields[key])
    return 0


def _frozen(value: object) -> Any:
    """JSON lists back to the tuples the frozen facts hold (nested too), and a layer shape's
    object back to its value."""
    if isinstance(value, dict):
        return KvLayerShape(**value)
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _pinpoints(values: object) -> tuple[tuple[int, int], ...]:
    """The GGUF's flat [w1, h1, w2, h2, …] as (width, height) pairs."""
    flat = [int(v) for v in values] if isinstance(values, (list, tuple)) else []
    return tuple((flat[i], flat[i + 1]) for i in range(0, len(flat) - 1, 2))


def read_image_newline(path: Path) -> np.ndarray:
    """LLaVA-NeXT's learned newline vector (float32), which llama.cpp does not load; ModelError if absent."""
    import numpy as np

    reader = _open(Path(path), role="--mmproj")
    tensor = next((t for t in reader.tensors if t.name == IMAGE_NEWLINE_TENSOR), None)
    if tensor is None:
        raise ModelError(f"{path}: has no {IMAGE_NEWLINE_TENSOR} tensor; it is not a LLaVA-1.6 projector")
    return np.asarray(tensor.data, dtype=np.float32).reshape(-1).copy()


def _cached(path: Path, kind: type[_Facts], read: Any) -> _Facts:
    """GGUFReader parses the whole vocabulary in Python (seconds); remember what it found."""
    _check_file(path)
    stat = path.stat()
    key = f"{_CACHE_VERSION}:{kind.__name__}:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    entry = cache_dir() / "gguf-facts" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    try:
        data = json.loads(entry.read_text())
        data["path"] = path
        return kind(**{f.name: _frozen(data[f.name]) for f in fields(kind)})
    except (OSError, ValueError, KeyError, TypeError):
        pass
    facts = read(path)
    try:
        write_atomically(entry, json.dumps({**asdict(facts), "path": str(path)}), durable=False)
    except OSError:
        pass  # a read-only cache only costs time
    return facts


def _check_file(path: Path) -> None:
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if path.is_dir():
        raise ModelError(f"{path}: is a directory, not a GGUF file")


def _projection_width(tensors: dict[str, Any], fields: dict[str, Any]) -> int:
    # The last mm.N.weight decides the output width; ggml's first dim is the input width.
    mm_weights = sorted(
        (int(name.split(".")[1]), t) for name, t in tensors.items()
        if re.fullmatch(r"mm\.\d+\.weight", name) and len(t.shape) == 2
    )
    if mm_weights:
        return int(mm_weights[-1][1].shape[1])
    return int(fields.get("clip.vision.projection_dim", 0))


def _open(path: Path, *, role: str) -> GGUFReader:
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(f"{path}: not a GGUF file ({role} needs a .gguf)")
    from gguf import GGUFReader  # deferred: importing gguf costs ~0.2 s

    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # gguf raises bare ValueError/IndexError/struct.error on damage
        raise ModelError(f"{path}: truncated or corrupt GGUF ({exc})") from None
    data_end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if data_end > path.stat().st_size:
        raise ModelError(f"{path}: truncated GGUF ({path.stat().st_size:,} of {data_end:,} bytes); "
                         "download it again")
    return reader


def _fields(reader: GGUFReader) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key in ("tokenizer.ggml.tokens",):
            out[key] = range(len(field.data))  # only the count is needed
            continue
        if key.startswith("tokenizer.ggml.") and key not in ("tokenizer.ggml.model",):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # an odd field type must not stop us reading the rest
            continue
    return out
