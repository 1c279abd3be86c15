"""`edgevlm serve` as a user runs it: a real process, stopped with SIGTERM, restarted warm."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from .test_server import free_port, photo_bytes


def _start(models: dict[str, Path], port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("EDGEVLM_NO_CACHE", None)  # the disk cache is what this test is about
    process = subprocess.Popen(
        [sys.executable, "-m", "edgevlm.cli", "serve", "--model", str(models["text"]),
         "--mmproj", str(models["mmproj_112"]), "--n-ctx", "2048", "--max-tokens", "8",
         "--port", str(port)], stderr=subprocess.PIPE, text=True, env=env)
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
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
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
