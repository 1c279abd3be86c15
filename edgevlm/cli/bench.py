"""`edgevlm bench`: stage-by-stage timings on the user's own machine, pool 1 beside pool 2.

Everything runs in one process on one loaded model, one after the other, so the ratios
compare like with like. llama.cpp's own `llama-mtmd-cli` is run beside it when present.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from edgevlm.chat.records import plain_value, to_plain
from edgevlm.chat.settings import ChatSettings, SettingsChange
from edgevlm.describe.describer import (
    DescribeEvent,
    Describer,
    DescribeResult,
    ImageDone,
    ImageFailed,
    describe_images,
)
from edgevlm.errors import ImageError, one_line
from edgevlm.runtime.conversations import conversation_for, describers_for
from edgevlm.runtime.loading import Loaded
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import load_image

BENCH_PROMPT = "Describe this photo in detail."
FOLLOW_UPS = ("What colours stand out?", "Is there any text?", "What is in the top left corner?")
# Targets from the pooling issue: measured side by side, reported, never asserted.
TARGET_TILE_PREFILL_RATIO = 0.35
TARGET_TTFT_RATIO = 0.5
TARGET_PREPROCESS_SHARE = 0.05
TARGET_PEER_OVERHEAD = 0.05


@dataclass(frozen=True)
class DescribeRun:
    """One describe configuration, median over repeats."""

    label: str
    pool: int
    grid: tuple[int, int]
    n_tiles: int
    visual_tokens: int
    tile_tokens: int
    prefill_tokens: int
    decode_image_s: float  # reading the file (JPEG draft decode, orientation)
    preprocess_s: float  # decode_image_s plus tiling and the projector's own resize/normalise
    clip_encode_s: float
    clip_per_view_s: float
    prefill_s: float
    prefill_tok_s: float
    tile_prefill_s: float
    ttft_s: float
    decode_tok_s: float
    itl_p50_s: float
    itl_p90_s: float
    completion_tokens: int


@dataclass(frozen=True)
class BenchChatTurn:
    """One turn of the chat scenario."""

    turn: int
    image: bool
    prefill_tokens: int
    ttft_s: float
    summary_s: float  # the image's summary and swap, made after the answer (idle time)
    kv_tokens: int
    visual_tokens_live: int


@dataclass(frozen=True)
class PeerRun:
    """llama.cpp's llama-mtmd-cli on the same image and model (global view only, by design)."""

    name: str
    prompt_tokens: int
    preprocess_s: float  # reading and resizing the image (from its log's timestamps)
    clip_encode_s: float
    prefill_s: float
    ttft_s: float  # preprocess + CLIP encode + prompt eval
    prefill_tok_s: float
    decode_tok_s: float


@dataclass(frozen=True)
class BenchReport:
    """Everything `edgevlm bench` measured."""

    model: str
    mmproj: str
    image: str
    image_size: tuple[int, int]
    n_ctx: int
    n_gpu_layers: int
    n_threads: int
    flash_attn: bool
    n_ubatch: int
    load_s: float
    repeats: int
    runs: tuple[DescribeRun, ...]
    chat: tuple[BenchChatTurn, ...]
    peer: PeerRun | None
    peer_error: str = ""

    def run(self, label: str) -> DescribeRun | None:
        """The describe run with this label, if it was made."""
        return next((r for r in self.runs if r.label == label), None)

    def ratios(self) -> dict[str, float]:
        """The side-by-side ratios the targets are stated in."""
        out: dict[str, float] = {}
        full, pooled, glob = self.run("tiles pool 1"), self.run("tiles pool 2"), self.run("global only")
        if full and pooled and full.tile_prefill_s:
            out["tile_prefill_pool2_vs_pool1"] = pooled.tile_prefill_s / full.tile_prefill_s
            out["ttft_pool2_vs_pool1"] = pooled.ttft_s / full.ttft_s
        if full:
            out["preprocess_share_of_ttft"] = full.preprocess_s / full.ttft_s
        if glob and self.peer and self.peer.ttft_s:
            out["global_ttft_vs_mtmd_cli"] = glob.ttft_s / self.peer.ttft_s
        native = self.run("mtmd layout")
        if native and self.peer and self.peer.ttft_s:
            out["mtmd_layout_ttft_vs_mtmd_cli"] = native.ttft_s / self.peer.ttft_s
            if self.peer.decode_tok_s:
                out["mtmd_layout_decode_vs_mtmd_cli"] = native.decode_tok_s / self.peer.decode_tok_s
        return out

    def verdicts(self) -> tuple[Verdict, ...]:
        """Each measured ratio against its target: met or missed (reported, never asserted)."""
        ratios = self.ratios()
        return tuple(Verdict(key, name, ratios[key], limit, unit)
                     for key, name, limit, unit in TARGETS if key in ratios)

    def to_json(self) -> dict[str, Any]:
        """Plain data for --json; floats rounded."""
        return to_plain(self) | {"ratios": plain_value(self.ratios()),
                                 "verdicts": {v.key: v.met for v in self.verdicts()}}


@dataclass(frozen=True)
class Verdict:
    """One ratio and its target (an upper limit)."""

    key: str
    name: str
    value: float
    limit: float
    unit: str  # "x" (a ratio) or "%" (a share)

    @property
    def met(self) -> bool:
        return self.value <= self.limit


# (ratio key, what it compares, upper limit, unit): the targets from the pooling issue.
TARGETS = (
    ("tile_prefill_pool2_vs_pool1", "local tiles' prefill, pool 2 vs 1 (same grid)",
     TARGET_TILE_PREFILL_RATIO, "x"),
    ("ttft_pool2_vs_pool1", "time to first token, pool 2 vs 1 (same grid)", TARGET_TTFT_RATIO, "x"),
    ("preprocess_share_of_ttft", "preprocessing share of TTFT (tiles, pool 1)",
     TARGET_PREPROCESS_SHARE, "%"),
    ("global_ttft_vs_mtmd_cli", "global-view TTFT vs llama-mtmd-cli", 1 + TARGET_PEER_OVERHEAD, "x"),
    ("mtmd_layout_ttft_vs_mtmd_cli", "an mtmd family's TTFT vs llama-mtmd-cli (same image budget)",
     1 + TARGET_PEER_OVERHEAD, "x"),
)


def synthetic_photo(path: Path, size: tuple[int, int] = (3840, 2160)) -> Path:
    """A deterministic 4K test photo (gradients, shapes, small text, noise) saved as JPEG."""
    width, height = size
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None, None]
    sky = np.concatenate([90 + 100 * y + 0 * x, 140 + 80 * y + 0 * x, 220 - 60 * y + 20 * x], axis=2)
    noise = np.random.default_rng(0).normal(0, 6, (height, width, 1)).astype(np.float32)
    image = Image.fromarray(np.clip(sky + noise, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, int(height * 0.7), width, height), fill=(70, 110, 60))
    draw.ellipse((int(width * 0.75), int(height * 0.08), int(width * 0.85), int(height * 0.26)),
                 fill=(250, 220, 90))
    draw.rectangle((int(width * 0.2), int(height * 0.45), int(width * 0.4), int(height * 0.75)),
                   fill=(170, 60, 50))
    for i in range(12):
        draw.text((60 + 300 * i, int(height * 0.9)), f"SIGN {i + 1}", fill=(255, 255, 255))
    image.save(path, quality=90)
    return path


def run_bench(loaded: Loaded, image_path: Path, *, turns: int = 4, max_tokens: int = 32,
              repeats: int = 1, peer: Path | None = None,
              on_step: Callable[[str], None] | None = None) -> BenchReport:
    """Describe the image in three or four configurations (--pool auto only when it differs),
    run a short chat, and the peer if given."""
    step = on_step or (lambda _label: None)
    engine = loaded.engine
    # A family mtmd lays out has one layout, mtmd's own: no tiles of edgevlm's to compare.
    native = not loaded.layout.cuts_tiles
    d = describers_for(loaded, ChatSettings(max_tokens=max_tokens, sampling=Sampling(temperature=0.0),
                                            max_tiles=None if native else 0))[0]
    step("warm-up")
    size = _describe_repeatedly(d, image_path, 1)[0].result.image_size  # upright, as shown
    runs = ([_native_run(d, image_path, repeats, step)] if native
            else _describe_runs(d, image_path, repeats, step))
    step("chat")
    chat = _chat_scenario(loaded, image_path, turns=turns, max_tokens=max_tokens)
    # The peer gets the same image budget where mtmd's own default would give it more tokens.
    cap = runs[0].visual_tokens if native else None
    peer_run, peer_error = _peer(peer, loaded, image_path, max_tokens=max_tokens, repeats=repeats, step=step,
                                 image_max_tokens=cap)
    cfg = engine.config
    return BenchReport(
        model=str(loaded.choice.model_path), mmproj=str(loaded.choice.mmproj_path),
        image=str(image_path), image_size=size, n_ctx=engine.n_ctx,
        n_gpu_layers=loaded.n_gpu_layers, n_threads=engine.n_threads, flash_attn=bool(cfg.flash_attn),
        n_ubatch=min(cfg.n_ubatch, cfg.n_batch), load_s=engine.load_s, repeats=repeats, runs=tuple(runs),
        chat=chat, peer=peer_run, peer_error=peer_error)


def _describe_repeatedly(d: Describer, image_path: Path, repeats: int) -> list[ImageDone]:
    """The same image `repeats` times through the describe core; a bad image is an error."""
    done: list[ImageDone] = []

    def keep(event: DescribeEvent) -> None:
        if isinstance(event, ImageFailed):
            raise ImageError(event.error)
        if isinstance(event, ImageDone):
            done.append(event)

    describe_images(d, [image_path] * repeats, BENCH_PROMPT, on_event=keep)
    return done


def _describe_runs(d: Describer, image_path: Path, repeats: int,
                   step: Callable[[str], None]) -> list[DescribeRun]:
    def measure(label: str, pool: int | None, max_tiles: int | None) -> DescribeRun:
        step(label)
        d.configure(SettingsChange(pool=pool, max_tiles=max_tiles))
        return _median_run(label, [e.result for e in _describe_repeatedly(d, image_path, repeats)])

    runs = [measure("global only", 1, 0), measure("tiles pool 1", 1, None)]
    same_grid = runs[1].n_tiles
    if same_grid:
        runs.append(measure("tiles pool 2", 2, same_grid))
    auto = measure("tiles pool auto", None, None)
    if (auto.grid, auto.pool) not in {(r.grid, r.pool) for r in runs}:
        runs.append(auto)
    return runs


def _native_run(d: Describer, image_path: Path, repeats: int, step: Callable[[str], None]) -> DescribeRun:
    step("mtmd layout")
    return _median_run("mtmd layout", [e.result for e in _describe_repeatedly(d, image_path, repeats)])


def _peer(peer: Path | None, loaded: Loaded, image_path: Path, *, max_tokens: int, repeats: int,
          step: Callable[[str], None], image_max_tokens: int | None = None) -> tuple[PeerRun | None, str]:
    if peer is None:
        return None, ""
    step("llama-mtmd-cli")
    try:
        return run_peer(peer, loaded, image_path, max_tokens=max_tokens, repeats=repeats,
                        image_max_tokens=image_max_tokens), ""
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return None, one_line(exc)


def _median_run(label: str, samples: list[DescribeResult]) -> DescribeRun:
    def med(get: Callable[[DescribeResult], float]) -> float:
        return statistics.median(get(r) for r in samples)

    first = samples[0]
    views = 1 + first.shown.n_tiles
    return DescribeRun(
        label=label, pool=first.shown.pool, grid=first.shown.grid, n_tiles=first.shown.n_tiles,
        visual_tokens=first.request.visual_tokens, tile_tokens=first.shown.tile_tokens,
        prefill_tokens=first.prompt_tokens - first.cache.cached_tokens,
        decode_image_s=med(lambda r: r.read_s), preprocess_s=med(lambda r: r.request.preprocess_s),
        clip_encode_s=med(lambda r: r.request.clip_encode_s),
        clip_per_view_s=med(lambda r: r.request.clip_encode_s / views),
        prefill_s=med(lambda r: r.request.prefill_s), prefill_tok_s=med(lambda r: r.request.prefill_tok_s),
        tile_prefill_s=med(lambda r: r.shown.tile_prefill_s),
        ttft_s=med(lambda r: r.request.ttft_s), decode_tok_s=med(lambda r: r.request.decode_tok_s),
        itl_p50_s=med(lambda r: r.request.itl_p50_s), itl_p90_s=med(lambda r: r.request.itl_p90_s),
        completion_tokens=first.completion_tokens)


def _chat_scenario(loaded: Loaded, image_path: Path, *, turns: int,
                   max_tokens: int) -> tuple[BenchChatTurn, ...]:
    """Image, follow-up, image, follow-up, …: what a chat costs per turn as it goes on."""
    settings = ChatSettings(max_tokens=max_tokens, sampling=Sampling(temperature=0.0), pool=None)
    conversation = conversation_for(loaded, settings)
    out = []
    for turn in range(1, turns + 1):
        with_image = turn % 2 == 1
        started = time.perf_counter()
        image = load_image(image_path, useful_pixels=conversation.useful_pixels) if with_image else None
        question = BENCH_PROMPT if with_image else FOLLOW_UPS[(turn // 2 - 1) % len(FOLLOW_UPS)]
        _, stats = conversation.ask(question, image=image, started=started)
        summary_s = conversation.summarise_pending()  # as while the user reads and types
        out.append(BenchChatTurn(turn=turn, image=with_image, prefill_tokens=stats.request.prefill_tokens,
                                 ttft_s=stats.request.ttft_s, summary_s=summary_s,
                                 kv_tokens=conversation.kv_tokens,
                                 visual_tokens_live=conversation.visual_tokens_live))
    conversation.reset()
    return tuple(out)


# -- llama.cpp's own CLI ---------------------------------------------------------------------

_PROMPT_EVAL_RE = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL_RE = re.compile(r"(?<!prompt )eval time =\s*([\d.]+) ms /\s*(\d+) runs")
_ENCODE_RE = re.compile(r"(?:mtmd batch encoding done|image slice encoded) in\s*([\d.]+) ms")
# common/log.cpp stamps each line [minutes.seconds.ms.us]; the gap from the CLI's banner to the
# first encode is its image read and preprocessing, which it does not time itself.
_STAMP_RE = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ", re.MULTILINE)


def run_peer(binary: Path, loaded: Loaded, image_path: Path, *, max_tokens: int,
             repeats: int = 1, image_max_tokens: int | None = None) -> PeerRun:
    """Run llama-mtmd-cli as a user would (same model, image, threads, context) and read its timings."""
    engine = loaded.engine
    command = [str(binary), "-m", str(loaded.choice.model_path), "--mmproj", str(loaded.choice.mmproj_path),
               "--image", str(image_path), "-p", BENCH_PROMPT, "-n", str(max_tokens), "--temp", "0",
               "-t", str(engine.n_threads), "-c", str(engine.n_ctx), "-ngl", str(loaded.n_gpu_layers),
               "-ub", str(min(engine.config.n_ubatch, engine.config.n_batch)),
               "-fa", "on" if engine.config.flash_attn else "off", "-lv", "4"]  # 4: its timings
    if image_max_tokens:
        command += ["--image-max-tokens", str(image_max_tokens)]
    samples = []
    for _ in range(repeats + 1):
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ValueError(f"{binary.name} exited {done.returncode}: {tail[0]}")
        samples.append(parse_peer_log(done.stderr + done.stdout))
    runs = samples[1:]  # the first only warmed the page cache
    return PeerRun(
        name=binary.name, prompt_tokens=runs[0].prompt_tokens,
        preprocess_s=statistics.median(r.preprocess_s for r in runs),
        clip_encode_s=statistics.median(r.clip_encode_s for r in runs),
        prefill_s=statistics.median(r.prefill_s for r in runs),
        ttft_s=statistics.median(r.ttft_s for r in runs),
        prefill_tok_s=statistics.median(r.prefill_tok_s for r in runs),
        decode_tok_s=statistics.median(r.decode_tok_s for r in runs))


def parse_peer_log(text: str) -> PeerRun:
    """Timings from llama-mtmd-cli's log (llama_perf_context_print and mtmd's encode line)."""
    prompt = _PROMPT_EVAL_RE.search(text)
    if prompt is None:
        raise ValueError("no 'prompt eval time' in llama-mtmd-cli's output")
    prefill_s, prompt_tokens = float(prompt.group(1)) / 1000, int(prompt.group(2))
    encode_s = sum(float(m) for m in _ENCODE_RE.findall(text)) / 1000
    decode = _EVAL_RE.search(text)
    decode_tok_s = 0.0
    if decode is not None and float(decode.group(1)) > 0:
        decode_tok_s = int(decode.group(2)) / (float(decode.group(1)) / 1000)
    preprocess_s = _stamp_gap(text, "experimental CLI", "encoding mtmd batch")
    return PeerRun(name="llama-mtmd-cli", prompt_tokens=prompt_tokens, clip_encode_s=encode_s,
                   preprocess_s=preprocess_s, prefill_s=prefill_s,
                   ttft_s=preprocess_s + encode_s + prefill_s,
                   prefill_tok_s=prompt_tokens / prefill_s if prefill_s else 0.0,
                   decode_tok_s=decode_tok_s)


def _stamp_gap(text: str, first: str, second: str) -> float:
    """Seconds between the log lines containing `first` and `second` (0 if either is missing)."""
    stamps: dict[str, float] = {}
    for line in text.splitlines():
        match = _STAMP_RE.match(line)
        for key in (first, second):
            if match and key in line and key not in stamps:
                minutes, seconds, ms, us = (int(g) for g in match.groups())
                stamps[key] = minutes * 60 + seconds + ms / 1e3 + us / 1e6
    return max(stamps[second] - stamps[first], 0.0) if len(stamps) == 2 else 0.0
