"""What a PDF may cost the server (issue 49.2): a 1 KiB PDF of 8 blank 5700x5700 pt pages took it
from 150 MiB to 5.1 GiB, and 40 of them or 500 blank letter pages ended in a MemoryError 500.
Each is now answered or refused at once, the pages counted against the room before any is
drawn, each drawn at what its view uses, and the memory given back after. The server runs in a
process of its own (its RSS), on the fake engine."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ..conftest import ROOT
from .test_app import free_port


def blank_pdf(n_pages: int, size_pt: tuple[int, int]) -> bytes:
    """A PDF of blank pages: a few hundred bytes, whatever the pages' size."""
    width, height = size_pt
    kids = " ".join(f"{3 + i} 0 R" for i in range(n_pages))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{kids}] /Count {n_pages} >>".encode()]
    objects += [f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width} {height}] >>".encode()] * n_pages
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _ask(url: str, pdf: bytes) -> httpx.Response:
    data = "data:application/pdf;base64," + base64.b64encode(pdf).decode()
    part = {"type": "file", "file": {"filename": "blank.pdf", "file_data": data}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Read it."}, part]}],
            "max_tokens": 8}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


@pytest.mark.slow
def test_huge_or_many_blank_pages_are_answered_or_refused_at_once_in_bounded_memory() -> None:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.server.fake_server", str(port)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes(server.pid))
            time.sleep(0.01)

    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/health").status_code == 200
        idle = _rss_bytes(server.pid)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        outcomes = {}
        for name, pdf in [("8 pages of 5700 pt", blank_pdf(8, (5700, 5700))),
                          ("40 pages of 5700 pt", blank_pdf(40, (5700, 5700))),
                          ("500 letter pages", blank_pdf(500, (612, 792)))]:
            began = time.perf_counter()
            reply = _ask(url, pdf)
            outcomes[name] = (reply.status_code, time.perf_counter() - began)
            assert reply.status_code in (200, 400), reply.text
            if reply.status_code == 400:
                assert reply.json()["error"]["code"] == "context_length_exceeded", reply.text
        stop.set()
        watcher.join()
        time.sleep(0.5)
        after = _rss_bytes(server.pid)
    finally:
        stop.set()
        server.terminate()
        server.wait(timeout=30)
    assert outcomes["8 pages of 5700 pt"][0] == 200, outcomes  # 8 global views fit 2048 tokens
    assert outcomes["40 pages of 5700 pt"][0] == 400 and outcomes["500 letter pages"][0] == 400, outcomes
    assert all(seconds < 2 for _, seconds in outcomes.values()), outcomes
    assert peak[0] - idle < 1 << 30, (peak[0] - idle) >> 20
    assert after - idle < 100 << 20, (after - idle) >> 20
