"""One renderer for what a turn cost (render.cost_line): describe's stats line and the chat's say
it in the same words, from the same parts, and its numbers add up."""

from __future__ import annotations

from dataclasses import replace

from edgevlm.chat.records import CacheFigures, ShownFigures, TurnStats
from edgevlm.cli.render import cost_line, shown_text, stats_line
from edgevlm.cli.repl import _brief
from edgevlm.describe.describer import DescribeResult
from edgevlm.store.prefix_cache import PrefixTier
from edgevlm.values.stats import RequestStats

DONE = RequestStats(prefill_tokens=600, visual_tokens=576, completion_tokens=11, clip_encodes=1,
                    preprocess_s=0.05, clip_encode_s=0.4, prefill_s=2.0, ttft_s=2.5, decode_s=0.5)
SHOWN = ShownFigures(grid=(2, 2), n_tiles=4, pool=2)
CACHE = CacheFigures(kv_tokens=700, cached_tokens=40, prefix_cache=PrefixTier.RAM)


def test_describe_and_chat_print_the_same_cost_line() -> None:
    result = DescribeResult(image="photos/bus.jpg", text="a bus", prompt_tokens=640, completion_tokens=11,
                            n_ctx=4096, n_gpu_layers=0, request=DONE, shown=SHOWN, cache=CACHE)
    turn = TurnStats(turn=1, prompt_tokens=640, completion_tokens=11, request=DONE, shown=SHOWN, cache=CACHE)
    costs = cost_line(shown_text(SHOWN, 576), DONE, CACHE, prompt_tokens=640, completion_tokens=11)
    assert costs == ("2x2 grid (4 tiles, pooled 2x2), 576 visual tokens | TTFT 2.50 s (prefill 600 tok "
                     "at 300 tok/s, CLIP 0.40 s, image prefix from RAM in 0.00 s) | decode 20.0 tok/s, "
                     "11 tokens")
    assert stats_line(result) == f"[dim]bus.jpg: {costs}[/]"
    assert _brief(turn, 4096) == f"{costs} | KV 700/4096"


def test_how_an_image_was_shown_is_named_by_what_the_turn_held() -> None:
    assert shown_text(ShownFigures(), 0) == "text only"
    assert shown_text(ShownFigures(), 576) == "global view only"
    assert shown_text(ShownFigures(layout="mtmd-qwen2.5vl"), 1020) == "mtmd-qwen2.5vl layout"
    tiled = ShownFigures(grid=(4, 2), n_tiles=8, layout="mtmd-internvl")  # the processor's tiles
    assert shown_text(tiled, 2304) == "mtmd-internvl layout, 4x2 tiles and a thumbnail"
    text = cost_line("text only", replace(DONE, visual_tokens=0, clip_encodes=0), CacheFigures(),
                     prompt_tokens=620, completion_tokens=11)
    assert text.startswith("text only | TTFT")  # no "0 visual tokens" for a follow-up
    assert "prefill 620 tok" in text and "image prefix" not in text
