"""llama.cpp's RPC backend end to end: `edgevlm worker` processes on 127.0.0.1 lending their CPU.

Every client runs in a subprocess: once a process registers RPC devices, llama.cpp offloads
every later model in that process to them, so the test process itself never does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgevlm.rpc.endpoints import hello

from ..conftest import run_cli
from ..server.test_app import free_port

pytestmark = pytest.mark.slow
QUESTION = "What is in this photo?"


def start_worker(port: int, cache: Path) -> subprocess.Popen[str]:
    """`edgevlm worker` on 127.0.0.1:port, once it answers the protocol's HELLO."""
    process = subprocess.Popen([sys.executable, "-m", "edgevlm.cli", "worker", "--port", str(port),
                                "--cache", str(cache)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            hello(f"127.0.0.1:{port}", timeout_s=1)
            return process
        except Exception:
            time.sleep(0.2)
    process.kill()
    raise AssertionError(f"the worker did not start: {process.stderr.read() if process.stderr else ''}")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two workers; their endpoints as --rpc takes them."""
    cache = tmp_path_factory.mktemp("rpc-cache")
    ports = [free_port(), free_port()]
    processes = [start_worker(port, cache) for port in ports]
    try:
        yield ",".join(f"127.0.0.1:{port}" for port in ports)
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)


def _model(test_models: dict[str, Path]) -> list[str]:
    return ["--model", str(test_models["text"]), "--mmproj", str(test_models["mmproj_112"]),
            "--n-ctx", "2048"]


def test_the_split_matches_llama_cpps_report(test_models: dict[str, Path], workers: str) -> None:
    result = run_cli("plan", *_model(test_models), "--rpc", workers, "--tensor-split", "1,3",
                     "--verify", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [d["name"] for d in plan["devices"]] == ["RPC0", "RPC1"]
    assert plan["devices"][1]["output_layer"] and plan["devices"][0]["blocks"] < plan["devices"][1]["blocks"]
    checks = {c["component"]: c for c in plan["verify"]}
    for name in ("weights RPC0", "kv RPC0", "weights RPC1", "kv RPC1"):
        check = checks[name]
        assert check["reported"] > 0, name  # llama.cpp put buffers on both workers
        assert abs(check["estimated"] - check["reported"]) <= 0.01 * check["reported"], check


def test_describe_over_rpc_gives_the_local_answer(test_models: dict[str, Path], workers: str,
                                                  tmp_path: Path) -> None:
    photo = Path(__file__).resolve().parents[2] / "scripts" / "sample-photo.jpg"
    args = ["describe", str(photo), *_model(test_models), "--max-tokens", "12", "--tiles", "2",
            "--prompt", QUESTION, "--json"]
    local = run_cli(*args)
    remote = run_cli(*args, "--rpc", workers)
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    local_text = json.loads(local.stdout)["text"]
    assert json.loads(remote.stdout)["text"] == local_text and local_text


def test_an_unreachable_worker_is_a_one_line_error(test_models: dict[str, Path]) -> None:
    port = free_port()
    result = run_cli("describe", "scripts/sample-photo.jpg", *_model(test_models), "--rpc",
                     f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert f"--rpc 127.0.0.1:{port}: no RPC worker answers there" in result.stderr
    assert "Traceback" not in result.stderr and "GGML_ASSERT" not in result.stderr


def test_a_worker_lost_mid_chat_ends_cleanly_with_the_session_kept(
        test_models: dict[str, Path], tmp_path: Path) -> None:
    port = free_port()
    worker = start_worker(port, tmp_path / "cache")
    session = tmp_path / "session.jsonl"
    chat = subprocess.Popen(
        [sys.executable, "-m", "edgevlm.cli", "chat", *_model(test_models), "--max-tokens", "8",
         "--rpc", f"127.0.0.1:{port}", "--session", str(session)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        assert chat.stdin is not None
        chat.stdin.write("hello there\n")
        chat.stdin.flush()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _turns(session) < 1:
            time.sleep(0.2)
        assert _turns(session) == 1
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        with contextlib.suppress(BrokenPipeError):  # the chat may notice the loss first, and end
            chat.stdin.write("and now?\n")
            chat.stdin.flush()
        _, stderr = chat.communicate(timeout=120)
    finally:
        worker.kill()
        chat.kill()
    assert chat.returncode == 1
    assert f"lost the RPC worker (127.0.0.1:{port})" in stderr and "Traceback" not in stderr
    assert _turns(session) == 1  # the finished turn is intact


def _turns(session: Path) -> int:
    if not session.exists():
        return 0
    return sum(1 for line in session.read_text().splitlines() if json.loads(line).get("type") == "turn")
