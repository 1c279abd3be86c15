"""Connections a client holds open without a request: each has its own deadline, and they never
crowd out ordinary requests, at an open-file limit of 256 too (issue 49.3). The server runs in
a process of its own (its limit, its log), on the fake engine; bounded: 300 sockets, ~15 s."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time

import httpx
import pytest

from edgevlm.server.app import HEADERS_TIMEOUT_S

from ..conftest import ROOT
from .test_app import free_port

STALLED = 300


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.slow
def test_stalled_connections_close_on_their_own_deadline_and_ordinary_requests_go_on() -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.server.fake_server", str(port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_limit_files)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        stalled, opened_at = [], time.monotonic()
        for i in range(STALLED):  # half send part of a request line, half nothing at all
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            if i % 2:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            stalled.append(sock)
        answered, statuses = 0, []
        with httpx.Client(timeout=30) as client:
            while time.monotonic() - opened_at < HEADERS_TIMEOUT_S + 3:
                for sock in stalled[1::20]:  # a byte now and then keeps no connection alive
                    try:
                        sock.send(b"X")
                    except OSError:
                        pass
                reply = client.get(f"{url}/health", headers={"Connection": "close"})
                statuses.append(reply.status_code)
                answered += reply.status_code == 200
                time.sleep(0.2)
        assert statuses and set(statuses) == {200}, statuses  # every ordinary request answered
        closed = 0
        for sock in stalled:
            sock.settimeout(5)
            try:
                head = sock.recv(64)
            except TimeoutError:  # still open: nobody closed it
                head = b"open"
            except OSError:  # reset: closed
                head = b""
            closed += head.startswith(b"HTTP/1.1 408") or head == b""
            sock.close()
        assert closed == STALLED and time.monotonic() - opened_at < HEADERS_TIMEOUT_S + 10
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        server.terminate()
        _, log = server.communicate(timeout=30)
    assert len(log.encode()) < 1 << 20 and "Traceback" not in log, log[-2000:]
