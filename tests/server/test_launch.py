"""`edgevlm serve` as a user runs it: a real process, stopped with SIGTERM, restarted warm."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from ..models.test_fetch import FakeHub
from .test_app import free_port, photo_bytes


def _start(models: dict[str, Path], port: int, *, max_tokens: int = 8,
           env: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    env.pop("EDGEVLM_NO_CACHE", None)  # the disk cache is what this test is about
    process = subprocess.Popen(
        [sys.executable, "-m", "edgevlm.cli", "serve", "--model", str(models["text"]),
         "--mmproj", str(models["mmproj_112"]), "--n-ctx", "2048", "--max-tokens", str(max_tokens),
         "--port", str(port), *extra], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"serve did not come up: {process.stderr.read() if process.stderr else ''}")


def _ask(port: int, image: bytes) -> dict[str, object]:
    # Two 336 px photos at once have taken past 120 s beside the suite's other workers on
    # 2 cores: what is tested is how the server stops, not how fast it answers.
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    reply = client.chat.completions.create(model="", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}])
    return reply.model_extra["edgevlm"]


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    return stderr


@pytest.mark.slow
def test_sigterm_stops_cleanly_and_a_restart_skips_clip(test_models: dict[str, Path]) -> None:
    port, image = free_port(), photo_bytes(300)
    server = _start(test_models, port)
    try:
        cold = _ask(port, image)
    finally:
        stderr = _stop(server)
    assert cold["clip_encodes"] == 1 + cold["n_tiles"]
    assert f"at http://127.0.0.1:{port}" in stderr and "Traceback" not in stderr
    assert "POST /v1/chat/completions 200" in stderr  # the one-line request log
    server = _start(test_models, port)
    try:
        warm = _ask(port, image)
    finally:
        _stop(server)
    assert warm["clip_encodes"] == 0 and warm["visual_tokens"] == cold["visual_tokens"]


def test_sigterm_while_idle_slots_summarise_exits_at_once(test_models: dict[str, Path]) -> None:
    # The global view alone (576 tokens a photo): each slot's 120-token caption then takes 2.5 s
    # alone, the health request 0.04 s after the answers. The tiles (1,728 tokens) cost 3x the CPU.
    port = free_port()
    server = _start(test_models, port, extra=("--parallel", "2", "--mmproj", str(test_models["mmproj_336"]),
                                              "--tiles", "0"))
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda seed: _ask(port, photo_bytes(seed)), (301, 302)))
    health = httpx.get(f"http://127.0.0.1:{port}/health").json()
    stopped_at = time.monotonic()
    stderr = _stop(server)
    assert all(a["visual_tokens_live"] > 0 for a in answers)  # both photos were live when answered
    assert health["summaries_pending"] >= 1 and health["running"] == 0  # the slots were summarising
    unmade = re.search(r"stopped at once: (\d+) answered images? left without a summary", stderr)
    assert unmade and int(unmade[1]) >= 1, stderr  # it did not wait for them
    assert time.monotonic() - stopped_at < 10 and "Traceback" not in stderr, stderr


LONG = {"messages": [{"role": "user", "content": "Count from 1 to 500, one number per line."}],
        "max_tokens": 400}


def test_sigterm_answers_the_waiting_503_and_ends_the_running_cleanly(test_models: dict[str, Path]) -> None:
    port = free_port()
    server = _start(test_models, port, max_tokens=400)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=60) as client, client.stream(
            "POST", f"{url}/v1/chat/completions", json={**LONG, "stream": True}) as running:
        lines = running.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # it is answering
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(httpx.post, f"{url}/api/chat", json={**LONG, "stream": False}, timeout=60)
            deadline = time.monotonic() + 10
            while httpx.get(f"{url}/health").json()["waiting"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            stopped_at = time.monotonic()
            server.send_signal(signal.SIGTERM)
            rest = list(lines)
            refused = waiting.result()
    _, stderr = server.communicate(timeout=30)
    assert time.monotonic() - stopped_at < 10 and server.returncode == 0, stderr
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]  # Ollama's shape
    assert [line for line in rest if line][-1] == "data: [DONE]"  # the running stream closed properly
    assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr


def test_api_pull_fetches_a_preset_with_progress(test_models: dict[str, Path], tmp_path: Path) -> None:
    import ollama

    hub = FakeHub()
    hub.thread.start()
    (tmp_path / "presets.local.toml").write_text(
        '[presets.fake]\nrepo_id = "edgevlm/fake-llava"\n'
        'model_file = "model.gguf"\nmmproj_file = "mmproj.gguf"\n')
    port = free_port()
    server = _start(test_models, port, env={"HF_ENDPOINT": hub.endpoint, "EDGEVLM_MODELS_DIR": str(tmp_path),
                                            "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"})
    try:
        client = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=60)
        progress = list(client.pull("fake", stream=True))
        with pytest.raises(ollama.ResponseError) as unknown:
            client.pull("no-such-model")
    finally:
        _stop(server)
        hub.server.shutdown()
    assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
    pulled = [p for p in progress if p.completed]
    assert pulled and pulled[-1].completed == pulled[-1].total
    assert (tmp_path / "fake" / "model.gguf").read_bytes() == hub.files["model.gguf"]
    assert unknown.value.status_code == 404 and "known presets" in unknown.value.error
