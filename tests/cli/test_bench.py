"""`edgevlm bench` on the test models: every stage measured, pool 1 and 2 side by side."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from edgevlm.cli.bench import parse_peer_log

from ..conftest import invoke_cli, run_cli

# llama-mtmd-cli -lv 4 output (the llama.cpp in llama-cpp-python 0.3.36), captured from a real run.
PEER_LOG = "\n".join([
    '0.00.281.660 W WARN: This is an experimental CLI for testing multimodal capability.',
    '0.00.358.747 I encoding mtmd batch, n_chunks = 1 (done = 1, total = 3)',
    '0.00.372.812 I mtmd batch encoding done in 14 ms',
    '0.00.372.835 I decoding image batch 1/1, n_tokens_batch = 576',
    '0.02.428.450 I image decoded (batch 1/1) in 2056 ms',
    '0.02.817.226 I llama_perf_context_print: prompt eval time =    2150.25 ms /   591 tokens '
    '(    3.64 ms per token,   274.85 tokens per second)',
    '0.02.817.228 I llama_perf_context_print:        eval time =     307.03 ms /    31 runs   '
    '(    9.90 ms per token,   100.97 tokens per second)',
    '0.02.817.229 I llama_perf_context_print:       total time =    2541.92 ms /   622 tokens',
])


def _models(models: dict[str, Path]) -> list[str]:
    return ["--model", str(models["text"]), "--mmproj", str(models["mmproj_112"]), "--n-ctx", "1024"]


def test_peer_log_is_read_into_ttft_and_speeds() -> None:
    peer = parse_peer_log(PEER_LOG)
    assert peer.prompt_tokens == 591
    assert peer.preprocess_s == pytest.approx(0.358747 - 0.281660)
    assert peer.clip_encode_s == pytest.approx(0.014)
    assert peer.prefill_s == pytest.approx(2.15025)
    assert peer.ttft_s == pytest.approx(peer.preprocess_s + 0.014 + 2.15025)
    assert peer.prefill_tok_s == pytest.approx(591 / 2.15025)
    assert peer.decode_tok_s == pytest.approx(31 / 0.30703)
    with pytest.raises(ValueError, match="prompt eval time"):
        parse_peer_log("llama-mtmd-cli: error: failed to load model")


@pytest.mark.slow
def test_bench_json_measures_every_stage(test_models: dict[str, Path]) -> None:
    result = invoke_cli("bench", *_models(test_models), "--max-tokens", "6", "--turns", "3", "--json",
                     "--no-peer")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    runs = {r["label"]: r for r in report["runs"]}
    assert list(runs)[:3] == ["global only", "tiles pool 1", "tiles pool 2"]
    full, pooled = runs["tiles pool 1"], runs["tiles pool 2"]
    assert runs["global only"]["n_tiles"] == 0 and runs["global only"]["visual_tokens"] == 64
    assert full["grid"] == pooled["grid"] and full["n_tiles"] >= 2
    assert (full["pool"], pooled["pool"]) == (1, 2)
    assert pooled["tile_tokens"] * 4 == full["tile_tokens"] == 64 * full["n_tiles"]
    for run in report["runs"]:
        assert run["ttft_s"] >= run["prefill_s"] > 0 and run["preprocess_s"] > 0
        assert run["decode_tok_s"] > 0 and run["clip_encode_s"] > 0
    assert report["image_size"] == [3840, 2160] and report["load_s"] > 0
    assert [t["image"] for t in report["chat"]] == [True, False, True]
    assert all(t["visual_tokens_live"] == 0 for t in report["chat"])
    assert report["chat"][1]["prefill_tokens"] < 40  # a follow-up re-prefills nothing
    assert {"tile_prefill_pool2_vs_pool1", "ttft_pool2_vs_pool1", "preprocess_share_of_ttft"} <= set(
        report["ratios"])
    assert report["peer"] is None


@pytest.mark.usefixtures("fake_engines")
def test_bench_table_and_a_broken_peer(test_models: dict[str, Path], tmp_path: Path) -> None:
    peer = tmp_path / "llama-mtmd-cli"
    peer.write_text("#!/bin/sh\necho 'failed to load model' >&2\nexit 1\n")
    peer.chmod(peer.stat().st_mode | stat.S_IEXEC)
    result = invoke_cli("bench", *_models(test_models), "--max-tokens", "4", "--turns", "0",
                     "--peer", str(peer))
    assert result.returncode == 0, result.stderr
    for text in ("model load", "time to first token", "prefill speed", "pool 2 vs 1", "decode"):
        assert text in result.stdout
    assert "llama-mtmd-cli: llama-mtmd-cli exited 1: failed to load model" in result.stdout


def test_bench_refuses_a_missing_peer_and_a_bad_image(test_models: dict[str, Path], tmp_path: Path) -> None:
    missing = run_cli("bench", *_models(test_models), "--peer", str(tmp_path / "nope"))
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    bad = run_cli("bench", *_models(test_models), "--image", str(broken))
    for result, message in ((missing, "make peers"), (bad, "broken.jpg: not an image")):
        assert result.returncode == 2 and message in result.stderr
        assert "Traceback" not in result.stderr


def test_bench_measures_an_mtmd_family_once_and_caps_the_peer_alike(test_models: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """The Qwen test pair: one run in mtmd's layout (no tiles to compare), and llama-mtmd-cli given
    the same image budget (a stand-in peer records its arguments and prints a real log's lines)."""
    args = tmp_path / "args.txt"
    peer = tmp_path / "llama-mtmd-cli"
    peer.write_text(f"#!/bin/sh\necho \"$@\" > {args}\n"
                    "echo 'prompt eval time =     100.00 ms /   120 tokens'\n"
                    "echo '       eval time =      50.00 ms /     5 runs'\n")
    peer.chmod(0o755)
    pair = ["--model", str(test_models["qwen_text"]), "--mmproj", str(test_models["qwen_mmproj"])]
    result = run_cli("bench", *pair, "--n-ctx", "2048", "--max-tokens", "6", "--turns", "2", "--json",
                     "--peer", str(peer))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    [run] = report["runs"]
    assert run["label"] == "mtmd layout" and run["visual_tokens"] > 0 and run["n_tiles"] == 0
    assert f"--image-max-tokens {run['visual_tokens']}" in args.read_text()
    assert {"mtmd_layout_ttft_vs_mtmd_cli", "mtmd_layout_decode_vs_mtmd_cli"} <= set(report["ratios"])
