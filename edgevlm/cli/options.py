"""The command line's vocabulary: every option once, with its metavar and help.

Commands in cli/app.py declare their parameters with these, one line each, so the same flag
reads the same everywhere and `--help` says what to type (NAME, N, FILE, auto|1|2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgevlm.vision.layout import Detail as ImageDetail
from edgevlm.vision.tiling import POOL_CHOICES

# The environment variables that stand for flags (an error about the value names the one used).
MODEL_ENV = "EDGEVLM_MODEL"
PARALLEL_ENV = "EDGEVLM_PARALLEL"
POOL_ENV = "EDGEVLM_POOL"
RPC_ENV = "EDGEVLM_RPC"
API_KEY_ENV = "EDGEVLM_API_KEY"
PEER_ENV = "EDGEVLM_PEER"

# -- values typed on the command line (each parser's ValueError says what is accepted) -------

def parse_tiles(value: str) -> int | None:
    """'auto' (None), '0' or a positive number of tiles; ValueError says what is accepted."""
    if value.strip() == "auto":
        return None
    if not value.strip().isdigit():
        raise ValueError(f"must be auto, 0 or a positive number, not '{value}'")
    return int(value)


def parse_detail(value: str) -> ImageDetail:
    """A task name (caption, chat, ocr, grounding, video-frame); ValueError says what is accepted."""
    try:
        return ImageDetail(value.strip().lower())
    except ValueError:
        raise ValueError(f"must be {', '.join(d.value for d in ImageDetail)}, not '{value}'") from None


def parse_pool(value: str) -> int | None:
    """'auto' (None), '1' or '2'; ValueError says what is accepted."""
    if value.strip() == "auto":
        return None
    if value.strip() not in {str(p) for p in POOL_CHOICES}:
        raise ValueError(f"must be {', '.join(map(str, POOL_CHOICES))} or auto, not '{value}'")
    return int(value)


# Bare K/M/G/T are binary, as GPU makers and nvidia-smi use them; KB/MB/GB are decimal (SI).
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1000, "m": 1 << 20, "mib": 1 << 20,
          "mb": 1000**2, "g": 1 << 30, "gib": 1 << 30, "gb": 1000**3, "t": 1 << 40, "tib": 1 << 40,
          "tb": 1000**4}


def parse_parallel(text: str) -> int | None:
    """--parallel: a count of sequences, or auto (None)."""
    if text.strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"must be auto or a number of sequences, not '{text}'") from None
    if value < 1:
        raise ValueError(f"must be at least 1, not {value}")
    return value


def parse_size(text: str) -> int:
    """'8GiB', '8G', '8192MiB', '12gb' or plain bytes to bytes; ValueError with a reason if not."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):]
    if unit not in _UNITS or not number:
        raise ValueError(f"'{text}' is not a size: use e.g. 8GiB, 8G, 8192MiB or a number of bytes")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"'{text}' is not a size: use e.g. 8GiB, 8G, 8192MiB or a number of bytes") from None
    if value <= 0:
        raise ValueError(f"'{text}' must be larger than zero")
    return int(value * _UNITS[unit])


# -- the model (describe, chat, plan, bench) --------------------------------------------------

Model = Annotated[str, typer.Option(
    "--model", "-m", envvar=MODEL_ENV, metavar="NAME|GGUF",
    help="A preset name (see `edgevlm models`) or a path to a text-model .gguf.")]
Mmproj = Annotated[Path | None, typer.Option(
    metavar="GGUF", help="The projector (mmproj) .gguf; needed when --model is a path.")]
NCtx = Annotated[int | None, typer.Option(
    "--n-ctx", metavar="TOKENS",
    help="Context size in tokens. Default: from the memory plan (4096 on a CPU).")]
NGpuLayers = Annotated[int | None, typer.Option(
    "--n-gpu-layers", metavar="N", help="Layers to put on the GPU (the output layer counts as one). "
    "Default: from the memory plan; all that fit.")]
Threads = Annotated[int | None, typer.Option(metavar="N", help="CPU threads for llama.cpp.", min=1)]
Parallel = Annotated[str, typer.Option(
    envvar=PARALLEL_ENV, metavar="N|auto",
    help="Requests decoded together, each on its own llama.cpp sequence with its own n_ctx. "
    "auto: up to 4 on a GPU with room (see `edgevlm plan --parallel`), 1 on the CPU.")]
PlanParallel = Annotated[str, typer.Option(
    "--parallel", envvar=PARALLEL_ENV, metavar="N|auto",
    help="Plan for N requests decoded together, each on its own sequence with its own n_ctx; "
    "auto: as many as fit, up to 4 (1 on the CPU).")]
Fetch = Annotated[bool, typer.Option("--fetch", help="Download the preset first if it is missing.")]

# -- answering --------------------------------------------------------------------------------

Prompt = Annotated[str | None, typer.Option(
    "--prompt", "-p", metavar="TEXT", help="What to ask about each image.")]
Ask = Annotated[list[str] | None, typer.Option(
    "--ask", metavar="QUESTION",
    help="Ask each image this too (repeatable): the image is prefilled once for all its questions.")]
Prompts = Annotated[Path | None, typer.Option(
    "--prompts", metavar="FILE", help="Questions to ask each image, one per line (as --ask).",
    exists=True, dir_okay=False, readable=True)]
MaxTokens = Annotated[int, typer.Option(metavar="N", help="Longest answer, in tokens.", min=1)]
Temperature = Annotated[float, typer.Option(
    metavar="T", help="Sampling temperature. 0, the default in every command, is greedy and repeatable.",
    min=0.0)]
Seed = Annotated[int | None, typer.Option(metavar="N", help="Sampling seed (with --temperature > 0).")]
Tiles = Annotated[str, typer.Option(
    metavar="auto|0|N", help="Local 336px tiles beside the global view: auto (as many as the context "
    "allows), 0 (global view only, best for whole-scene questions) or a maximum N.")]
Detail = Annotated[str, typer.Option(
    "--detail", metavar="TASK",
    help="What images are shown for, which sets how many tokens each may take within its family's "
    "limits: caption (few tokens: fast captions for a photo library), chat (the largest view that fits), "
    "ocr or grounding (at least the family's floor of tokens for small text and boxes, e.g. 1024 on "
    "Qwen-VL), video-frame. `edgevlm plan` shows each task's tokens.")]
Pool = Annotated[str, typer.Option(
    "--pool", envvar=POOL_ENV, metavar="auto|1|2",
    help="Average-pool each close-up tile's 24x24 tokens: 1 (full detail), 2 (2x2: 576 -> 144 tokens "
    "per tile, so prefill is ~4x cheaper and more tiles fit; small text suffers) or auto (full tiles "
    "while they fit, pooled tiles when pooling buys a larger grid). The global view is never pooled.")]

# -- describe: output and folders -------------------------------------------------------------

# Arguments are hidden from the options list (Typer would print their Python type there); the
# usage line names them and each command's help says what they are.
def _input_path(text: str) -> Path:
    """A photo, document, video or folder as given: an empty one is refused (Path("") is the
    current folder, and `describe ""` described all of it)."""
    if not text.strip():
        raise typer.BadParameter("an empty path names no image or folder (give . for this folder)")
    return Path(text)


Photos = Annotated[list[Path], typer.Argument(show_default=False, metavar="IMAGE_OR_FOLDER", hidden=True,
                                              parser=_input_path)]
JsonOut = Annotated[bool, typer.Option("--json", help="One JSON object per image on stdout.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress or stats on stderr.")]
Recursive = Annotated[bool, typer.Option("--recursive", "-r", help="Descend into subfolders.")]
Find = Annotated[str | None, typer.Option(
    "--find", metavar="WHAT", help="Find things in each photo, e.g. --find 'every street sign': their boxes "
    "in the photo's own pixels (upright, whatever the model was shown), one line each, or a `boxes` "
    "list with --json. Needs a model that writes boxes (Qwen2-VL, Qwen2.5-VL, Qwen3-VL); the photo is "
    "shown at --detail grounding unless --detail says otherwise.")]
Draw = Annotated[Path | None, typer.Option(
    "--draw", metavar="FILE", help="With --find on one photo: write it to FILE with the boxes drawn "
    "(JPEG, PNG or WebP by FILE's suffix).")]
Together = Annotated[bool, typer.Option(
    "--together", help="One answer about all the images, shown in one question (e.g. --prompt "
    "'What changed?'); they share the context's room.")]
Pages = Annotated[str | None, typer.Option(
    metavar="RANGES", help="Which pages of each PDF to read, e.g. 1-5,9 or 12- (default: all).")]
Merge = Annotated[str | None, typer.Option(
    "--merge", metavar="R[:TASKS]", show_default=False,
    help="Merge each image's visual tokens after the projector, similar neighbours into one, down to a "
         "share R of them (0.25: a quarter): a faster prefill and a smaller cache, for every family. Off "
         "for ocr and grounding unless named (--merge 0.5:chat,ocr); off by default. Judge the quality on "
         "your model: merged tokens are not what it was trained on.")]
FrameTokens = Annotated[int | None, typer.Option(
    "--frame-tokens", min=16, max=16384, metavar="N", show_default=False,
    help="The most visual tokens a video frame (or Qwen-VL's merged pair) may take [default: the family's "
         "budget for a frame, e.g. 768 for Qwen-VL, 70 for Gemma 4]: fewer tokens, smaller frames and a "
         "faster prefill. LLaVA always shows a frame's whole view (576).")]
Fps = Annotated[float | None, typer.Option(
    "--fps", min=0.01, max=30.0, show_default=False, metavar="FPS",
    help="Frames taken per second of a video [default: the model family's own: 2 for Qwen-VL, which "
         "sees two frames in one block; 1 otherwise]. A window shows 8 blocks.")]
Glob = Annotated[str | None, typer.Option(
    metavar="PATTERN", help="In folders, only images whose name matches this pattern (e.g. 'IMG_*').")]
WriteCaptions = Annotated[bool, typer.Option(
    help="Write IMAGE.jpg.txt next to each image (photo.jpg.txt for photo.jpg; or under --out-dir).")]
OutDir = Annotated[Path | None, typer.Option(
    metavar="DIR", help="With --write-captions: put the .txt files here, mirroring the folder tree.")]
Jsonl = Annotated[Path | None, typer.Option(
    metavar="FILE", help="Append one JSON object per image to this file.")]
Overwrite = Annotated[bool, typer.Option(help="Caption images that already have a caption.")]
Format = Annotated[str | None, typer.Option(
    "--format", metavar="text|json", help="json: the answer is a JSON object (enforced by a grammar).")]
Schema = Annotated[Path | None, typer.Option(
    metavar="FILE", help="A JSON Schema the answer must follow (enforced by llama.cpp's grammar sampler).")]
Tags = Annotated[bool, typer.Option(
    "--tags", help="Answer as {description, tags, text_in_image, people_count} for photo libraries.")]
MaxTags = Annotated[int, typer.Option(metavar="N", help="With --tags: at most N tags.", min=1, max=50)]
Language = Annotated[str, typer.Option(metavar="NAME", help="With --tags: the description's language.")]
WriteXmp = Annotated[bool, typer.Option(
    help="Write an XMP sidecar per image (dc:description, dc:subject) that photo tools read; merged "
    "into an existing one. Needs ExifTool.")]
Embed = Annotated[bool, typer.Option(
    help="Write the same XMP into the image file itself (atomically; pixels untouched).")]
XmpName = Annotated[str, typer.Option(
    metavar="IMG.jpg.xmp|IMG.xmp", help="Sidecar naming: IMG.jpg.xmp (darktable, digiKam, Immich) or "
    "IMG.xmp (Lightroom, Capture One).")]

# -- chat -------------------------------------------------------------------------------------

Summary = Annotated[str, typer.Option(
    metavar="caption|answer", help="What replaces an answered image in the cache: caption (a dense "
    "factual caption the model writes while it still sees the image) or answer (its answer).")]
KeepImages = Annotated[int, typer.Option(
    metavar="N", help="Keep the last N images live for follow-ups before they become text.", min=0)]
KeepThumbnails = Annotated[int, typer.Option(
    metavar="TOKENS", min=0, max=256,
    help="Keep each answered image beside its summary as a thumbnail of at most TOKENS visual tokens "
         "(its own rows merged, as --merge does), so a later question can compare it without showing it "
         "again; 0 (default): the summary alone. The oldest thumbnails go first when the context is short.")]
LookMatches = Annotated[int, typer.Option(
    metavar="N", min=0, max=4,
    help="Show again, for a question that names no earlier image, the N (at most) whose summaries share "
         "the most words with it (two at least), from the projector-row cache. 0 (default): only images "
         "a question names (\"image 2\", \"the first photo\", a file name) or /look come back.")]
System = Annotated[str | None, typer.Option(metavar="TEXT", help="A system prompt instead of the default.")]
Session = Annotated[Path | None, typer.Option(
    metavar="FILE", help="Append the transcript here (JSONL). Default: a new file in the user data "
    "directory, made at the first answer.")]
Resume = Annotated[Path | None, typer.Option(
    metavar="FILE", help="Continue a saved session with its model: text and image summaries are "
    "restored, no image is re-read.")]
StatsJson = Annotated[Path | None, typer.Option(
    metavar="FILE", help="Append one JSON object of stats per turn.")]

# -- devices (every command that loads a model) ------------------------------------------------

Rpc = Annotated[str | None, typer.Option(
    envvar=RPC_ENV, metavar="HOST:PORT[,…]", rich_help_panel="Devices",
    help="Use RPC workers (started with `edgevlm worker`) as extra devices, layers split across them.")]
TensorSplit = Annotated[str | None, typer.Option(
    metavar="W,W,…", rich_help_panel="Devices",
    help="Share of the layers per device, in llama.cpp's order (RPC workers, then local GPUs). "
    "Default: in proportion to each device's room.")]
SplitMode = Annotated[str, typer.Option(
    metavar="layer|row|none", rich_help_panel="Devices",
    help="How several GPUs share the model: whole layers, rows of each matrix, or none (--main-gpu only).")]
MainGpu = Annotated[int, typer.Option(
    metavar="N", rich_help_panel="Devices", help="With --split-mode none: the device index to use.", min=0)]
MmprojDevice = Annotated[str | None, typer.Option(
    metavar="DEVICE", rich_help_panel="Devices",
    help="The device for the vision projector (CUDA1, RPC0, CPU). Default: the one with the most "
    "room after the layers.")]

# -- worker -----------------------------------------------------------------------------------

WorkerHost = Annotated[str, typer.Option(
    "--host", metavar="ADDRESS", help="Address to listen on. Anything but loopback needs --allow-network.")]
WorkerPort = Annotated[int, typer.Option("--port", metavar="PORT", help="TCP port to listen on.")]
WorkerDevice = Annotated[str | None, typer.Option(
    "--device", metavar="CPU|CUDA0|…", help="The device to lend. Default: the first GPU, else the CPU.")]
WorkerCache = Annotated[Path | None, typer.Option(
    "--cache", metavar="DIR", help="Keep large tensors here by hash, so reloading a model does not "
    "resend its weights. Default: ~/.cache/edgevlm/rpc.")]
AllowNetwork = Annotated[bool, typer.Option(
    "--allow-network", help="Allow a --host other machines can reach (the protocol has no authentication).")]

# -- plan -------------------------------------------------------------------------------------

PlanModel = Annotated[str | None, typer.Argument(show_default=False, metavar="NAME|GGUF", hidden=True)]
Vram = Annotated[str | None, typer.Option(
    metavar="SIZE[,SIZE…]", help="Plan for cards with this much free memory (8GiB, 8G, 8192MiB, "
    "bytes; 8GiB,8GiB for two) instead of this machine's.")]
KvType = Annotated[str | None, typer.Option(
    metavar="f16|q8_0|q4_0", help="KV cache type. Default: f16, or q8_0 when it buys context.")]
FlashAttn = Annotated[bool, typer.Option(
    "--flash-attn/--no-flash-attn", help="Flash attention (smaller compute buffer).")]
SwaFull = Annotated[bool | None, typer.Option(
    "--swa-full/--no-swa-full", show_default=False,
    help="Sliding-window models (Gemma 3): keep the whole window cache, or a window's worth with "
    "checkpoints in RAM. Default: whole where it costs no layers or context.")]
AnswerRoom = Annotated[int, typer.Option(
    "--max-tokens", metavar="N", help="Answer length to leave room for.", min=1)]
PlanImages = Annotated[int, typer.Option(
    "--images", metavar="N", help="Plan the example 4K photo as one of N shown in one question "
    "(describe --together, several images in a message): each one's tokens, and how many fit.")]
Verify = Annotated[bool, typer.Option(
    help="Load the model with the plan and compare the estimate with llama.cpp's report.")]
PlanJson = Annotated[bool, typer.Option("--json", help="The plan as JSON, sizes in bytes.")]
NO_CACHE_ENV = "EDGEVLM_NO_CACHE"
BOOL_WORDS = ("1", "0", "true", "false", "yes", "no", "on", "off", "y", "n", "t", "f", "")
ENV_FLAGS = {MODEL_ENV: "--model", PARALLEL_ENV: "--parallel", POOL_ENV: "--pool", RPC_ENV: "--rpc",
             API_KEY_ENV: "--api-key", PEER_ENV: "--peer", NO_CACHE_ENV: "--no-cache"}
NoCache = Annotated[bool, typer.Option(
    "--no-cache", envvar=NO_CACHE_ENV,
    help="Do not keep or reuse projector rows or image prefixes (otherwise an image seen before "
         "skips CLIP, and its prefill where restoring is faster).")]

# -- serve ------------------------------------------------------------------------------------

Host = Annotated[str, typer.Option(
    metavar="ADDRESS", help="Address to listen on. Anything but loopback needs --api-key.")]
Port = Annotated[int, typer.Option(metavar="PORT", help="TCP port to listen on.")]
ApiKey = Annotated[str | None, typer.Option(
    envvar=API_KEY_ENV, metavar="KEY", help="Require `Authorization: Bearer KEY` on every API call.")]
MediaDir = Annotated[Path | None, typer.Option(
    metavar="DIR", help="Allow file:// image URLs inside this folder (refused otherwise).")]
MaxQueue = Annotated[int, typer.Option(
    metavar="N", help="Requests that may wait for the model; past that, 503 with Retry-After.", min=1)]
MaxBodyMb = Annotated[int, typer.Option(
    "--max-body-mb", metavar="MIB", help="Largest request body (base64 images included); 413 past it.",
    min=1)]

# -- bench ------------------------------------------------------------------------------------

BenchImage = Annotated[Path | None, typer.Option(
    "--image", metavar="FILE", help="The photo to measure on. Default: a generated 3840x2160 JPEG.")]
Turns = Annotated[int, typer.Option(
    metavar="N", help="Turns in the chat scenario (image, follow-up, …).", min=0)]
BenchTokens = Annotated[int, typer.Option(
    "--max-tokens", metavar="N", help="Tokens generated per answer.", min=2)]
Repeat = Annotated[int, typer.Option(
    metavar="N", help="Measured runs per configuration (the median is shown).", min=1)]
Peer = Annotated[Path | None, typer.Option(
    envvar=PEER_ENV, metavar="FILE", help="llama.cpp's llama-mtmd-cli to run beside edgevlm. "
    "Default: peers/bin/llama-mtmd-cli when `make peers` has built it.")]
NoPeer = Annotated[bool, typer.Option("--no-peer", help="Do not run llama-mtmd-cli.")]
BenchJson = Annotated[bool, typer.Option("--json", help="The numbers as one JSON object.")]

# -- fetch and the rest -----------------------------------------------------------------------

Presets = Annotated[list[str] | None, typer.Argument(metavar="NAME", show_default=False, hidden=True)]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's own log.")]
Debug = Annotated[bool, typer.Option(help="Show Python tracebacks for errors.")]


def flag_word(setting: str) -> str:
    """A core setting as the command line names it: n_ctx -> --n-ctx."""
    return "--" + setting.replace("_", "-")
