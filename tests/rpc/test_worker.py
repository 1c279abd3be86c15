"""`edgevlm worker`'s own output: one line per client, llama.cpp's banner only with --verbose."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from edgevlm.rpc.endpoints import hello
from edgevlm.rpc.worker import ClientLog

from ..server.test_app import free_port


def test_client_log_skips_its_own_probe_and_counts_clients() -> None:
    said: list[str] = []
    log = ClientLog(said.append, verbose=False, own_probes=1)
    for line in ("Starting RPC server v7.0.0", "  endpoint       : 127.0.0.1:1", ClientLog.CONNECTED,
                 ClientLog.CLOSED, ClientLog.CONNECTED, ClientLog.CONNECTED, ClientLog.CLOSED):
        log.line(line)
    assert [s.split(" ", 1)[1] for s in said] == [
        "a client connected (1 connected)", "a client connected (2 connected)", "a client left (1 connected)"]
    loud: list[str] = []
    ClientLog(loud.append, verbose=True).line("Starting RPC server v7.0.0")
    assert loud == ["Starting RPC server v7.0.0"]


def test_a_worker_says_who_connects_and_nothing_else() -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "edgevlm.cli", "worker", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                hello(f"127.0.0.1:{port}", timeout_s=1)
                break
            except Exception:
                assert time.monotonic() < deadline and process.poll() is None, "the worker did not start"
                time.sleep(0.2)
        time.sleep(1.0)  # let the connection lines come through
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    printed = stdout + stderr
    assert "Starting RPC server" not in printed and "Accepted client connection" not in printed
    assert "a client connected" in stderr and "a client left (0 connected)" in stderr
    assert "edgevlm worker stopped" in stderr
