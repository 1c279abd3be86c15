#!/usr/bin/env python3
"""A question over a 20-page PDF: edgevlm's page-by-page reading against one message holding
every page as an image (what llama-server takes, and what a client without edgevlm sends).

Both at the same per-image budget: the test pair's 576-token view per page (`--tiles 0` on
edgevlm, the LLaVA-1.5 projector's one view on llama-server), n_ctx 4096, CPU.
- edgevlm: `describe doc.pdf --ask Q` in process. Each page is read as its own turn (its
  transcript kept), then the question is one turn over the transcripts with the page it names
  shown again from the projector-row cache. Reported: tokens prefilled per page and for the
  question, the KV cells at their peak, TTFT of the answer, and the encoder runs.
- one message: llama-server (when `make peers` has built it) is sent the first k pages as
  image_url parts in one message, for growing k, until it runs out of context; without it, the
  arithmetic of the same message (k × 576 tokens plus the text) says where it would.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw

if TYPE_CHECKING:  # edgevlm loads inside the functions, after the cache folder is set
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.describe.describer import Describer
    from edgevlm.llama.sequence import EngineSequence
    from edgevlm.runtime.loading import Loaded
    from edgevlm.store.caches import EmbeddingCache

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_serve import LLAMA_SERVER, MMPROJ, TEXT, llama_server  # noqa: E402

N_CTX, MAX_TOKENS, VIEW_TOKENS = 4096, 16, 576
QUESTION = "What is the total on page 7?"


def write_document(path: Path, n_pages: int) -> Path:
    """A PDF of n_pages mixed-size pages, each with a heading and a few lines of figures."""
    pages = []
    for n in range(1, n_pages + 1):
        size = [(612, 792), (842, 595), (420, 595)][n % 3]
        page = Image.new("RGB", size, "white")
        draw = ImageDraw.Draw(page)
        draw.text((40, 40), f"Section {n}", fill="black")
        for line in range(6):
            draw.text((40, 80 + 18 * line), f"Item {n}.{line}: {7 * n + line} units", fill="black")
        draw.text((40, 200), f"Total: {100 + n} EUR", fill="black")
        pages.append(page)
    pages[0].save(path, save_all=True, append_images=pages[1:], resolution=72)
    return path


def counted_describer(text: Path, mmproj: Path, n_ctx: int, settings: ChatSettings
                      ) -> tuple[Loaded, EngineSequence, EmbeddingCache, Describer]:
    """A describer on the test pair with its caches, the projector-row cache held here so its
    encoder runs can be counted (loaded.image_cache() makes a new one each call)."""
    from edgevlm.chat.structured import TEXT as TEXT_OUTPUT
    from edgevlm.runtime.conversations import ModelSide, new_describer
    from edgevlm.runtime.loading import ModelFlags, load

    loaded = load(ModelFlags(model=str(text), mmproj=str(mmproj), n_ctx=n_ctx, n_gpu_layers=0,
                             answer_tokens=settings.max_tokens))
    sequence = loaded.engine.sequence()
    encoder = loaded.image_cache()
    describer = new_describer(sequence, ModelSide.of(loaded), settings, output=TEXT_OUTPUT, encoder=encoder,
                              prefix_cache=loaded.prefix_cache())
    return loaded, sequence, encoder, describer


def edgevlm_run(pdf: Path) -> dict[str, object]:
    """Read every page, then answer the question over the document; the numbers of both."""
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.describe.describer import DOCUMENT_PROMPT, ImageDone, describe_images, parts_room
    from edgevlm.describe.documents import ReadPage, ask_document
    from edgevlm.vision.documents import open_document

    loaded, sequence, encoder, describer = counted_describer(
        TEXT, MMPROJ, N_CTX, ChatSettings(max_tokens=MAX_TOKENS, max_tiles=0))
    pages = list(open_document(pdf).pages)
    read: list[ImageDone] = []
    cells: list[int] = []

    def on_event(event: object) -> None:
        if isinstance(event, ImageDone):
            read.append(event)
            cells.append(sequence.kv_cells())

    started = time.perf_counter()
    describe_images(describer, pages, DOCUMENT_PROMPT, on_event=on_event)
    read_s = time.perf_counter() - started
    misses_before = encoder.stats().misses
    room = parts_room(describer, DOCUMENT_PROMPT)
    transcripts = [ReadPage(event.path, event.result.text) for event in read]
    answer = ask_document(describer, transcripts, QUESTION, page_room=room, on_event=lambda _e: None)
    cells.append(sequence.kv_cells())
    loaded.engine.close()
    return {
        "pages": len(read), "read_s": read_s,
        "page_prefill": [e.result.prompt_tokens - e.result.cache.cached_tokens for e in read],
        "page_ttft_s": [e.result.request.ttft_s for e in read],
        "peak_cells": max(cells), "cells_page2": cells[1], "cells_last_page": cells[len(read) - 1],
        "answer_prefill": answer.prompt_tokens - answer.cache.cached_tokens,
        "answer_ttft_s": answer.request.ttft_s,
        "answer_visual": answer.request.visual_tokens, "shown_again": answer.images,
        "encodes_for_answer": encoder.stats().misses - misses_before,
    }


def page_urls(pdf: Path) -> list[str]:
    """Every page rendered as edgevlm renders it, as PNG data URLs (what a client would send)."""
    from edgevlm.vision.documents import open_document
    from edgevlm.vision.sources import load_source

    urls = []
    for page in open_document(pdf).pages:
        buf = io.BytesIO()
        load_source(page, useful_pixels=2_000_000).image.save(buf, "PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    return urls


def one_message_runs(pdf: Path, counts: list[int]) -> list[tuple[int, str]]:
    """llama-server sent the first k pages in one message, for each k; (k, outcome)."""
    from openai import APIError

    urls = page_urls(pdf)
    outcomes = []
    with llama_server(TEXT, MMPROJ, N_CTX) as (client, model):
        for k in counts:
            content = [*({"type": "image_url", "image_url": {"url": u}} for u in urls[:k]),
                       {"type": "text", "text": QUESTION}]
            started = time.perf_counter()
            try:
                reply = client.chat.completions.create(model=model, max_tokens=MAX_TOKENS, temperature=0,
                                                       messages=[{"role": "user", "content": content}])
            except APIError as exc:
                outcomes.append((k, f"refused: {str(exc).splitlines()[0][:90]}"))
                break
            timings = (reply.model_extra or {}).get("timings") or {}
            ttft = timings.get("prompt_ms", (time.perf_counter() - started) * 1000) / 1000
            outcomes.append((k, f"{reply.usage.prompt_tokens} prompt tokens, TTFT {ttft:.2f} s"))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # a cold cache: nothing seen before
        pdf = write_document(Path(tmp) / "report.pdf", args.pages)
        ours = edgevlm_run(pdf)
        prefill = ours["page_prefill"]
        print(f"A question over a {args.pages}-page PDF, n_ctx {N_CTX}, {VIEW_TOKENS}-token view per page, "
              "CPU\n")
        print("edgevlm describe report.pdf --ask (page by page, transcripts, the named page shown again)")
        print(f"  reading: {ours['pages']} pages in {ours['read_s']:.1f} s, {min(prefill)}-{max(prefill)} "
              f"tokens prefilled per page, TTFT {min(ours['page_ttft_s']):.2f}-"
              f"{max(ours['page_ttft_s']):.2f} s")
        print(f"  KV cells: {ours['cells_page2']} after page 2, {ours['cells_last_page']} after page "
              f"{ours['pages']}, peak {ours['peak_cells']} (of {N_CTX})")
        print(f"  the question: {ours['answer_prefill']} tokens prefilled ({ours['answer_visual']} visual, "
              f"{', '.join(str(i) for i in ours['shown_again']) or 'no page'} shown again), TTFT "
              f"{ours['answer_ttft_s']:.2f} s, encoder runs {ours['encodes_for_answer']}")
        print("\nevery page as an image in one message")
        counts = sorted({c for c in (1, 2, 4, 6, 8) if c < args.pages} | {args.pages})
        if LLAMA_SERVER.exists():
            for k, outcome in one_message_runs(pdf, counts):
                print(f"  llama-server, {k} pages: {outcome}")
        else:
            print(f"  llama-server not built (`make peers`); the same message's arithmetic at {VIEW_TOKENS} "
                  "tokens a page:")
            for k in counts:
                need = k * VIEW_TOKENS + 40 + MAX_TOKENS
                verdict = "fits" if need <= N_CTX else "runs out of context"
                print(f"  {k} pages: {need} tokens of {N_CTX}: {verdict}")


if __name__ == "__main__":
    main()
