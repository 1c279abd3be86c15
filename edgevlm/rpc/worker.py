"""`edgevlm worker`: this machine's CPU or GPU lent to another edgevlm, over llama.cpp's RPC backend.

The worker is ggml's own RPC server (`ggml_backend_rpc_start_server`), from the same
llama-cpp-python build as the client, so the protocol versions always match. It runs in a
thread: the C loop never returns, and the main thread stays free to take Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from edgevlm.errors import ConfigError
from edgevlm.llama.backends import backend_devices, capture_native_stdout, rpc_supported, serve_rpc
from edgevlm.llama.types import BackendDevice, default_threads
from edgevlm.network import check_port, is_loopback
from edgevlm.paths import cache_dir
from edgevlm.rpc.endpoints import DEFAULT_PORT, hello
from edgevlm.store.prefix_cache import RPC_CACHE

UNAUTHENTICATED = ("llama.cpp's RPC protocol has no authentication or encryption: anyone who can "
                   "reach this port can run code on the device and read what it holds. Use it only "
                   "on a network you trust.")


@dataclass(frozen=True)
class WorkerSettings:
    """The `worker` flags."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    device: str | None = None  # None: the first GPU, else the CPU
    cache: Path | None = None  # None: the user's cache folder; the weights then cross the network once
    allow_network: bool = False
    threads: int | None = None


def check(settings: WorkerSettings) -> None:
    """Refuse what cannot work or is unsafe, before anything starts."""
    if not rpc_supported():
        raise ConfigError("this llama.cpp build has no RPC backend; rebuild it with `make setup`")
    if not is_loopback(settings.host) and not settings.allow_network:
        raise ConfigError(f"--host {settings.host} lets other machines use this device; the RPC protocol "
                          "has no authentication, so add --allow-network if this network is trusted")
    check_port(settings.host, settings.port)


def pick_device(name: str | None) -> str:
    """The device to lend: the named one, else the first local GPU, else the CPU."""
    local = [d for d in backend_devices() if d.kind != "rpc"]
    if name is None:
        return local[0].name if local else "CPU"
    if name != "CPU" and name not in [d.name for d in local]:
        known = ", ".join(["CPU", *(d.name for d in local)])
        raise ConfigError(f"--device {name}: no such device here (this machine has: {known})")
    return name


def cache_folder(settings: WorkerSettings) -> Path:
    """Where the worker keeps large tensors by hash, so a reload does not resend the weights."""
    folder = settings.cache or cache_dir() / RPC_CACHE  # `edgevlm cache --clear` clears it too
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run(settings: WorkerSettings, device: str, *, on_ready: Callable[[], None],
        on_line: Callable[[str], None], verbose: bool = False) -> None:
    """Serve until Ctrl-C or SIGTERM; on_ready is told once the worker answers, and on_line
    gets one line per client that comes or goes (with verbose, everything llama.cpp prints)."""
    stop = threading.Event()
    endpoint = f"{settings.host}:{settings.port}"
    relay = ClientLog(on_line, verbose=verbose, own_probes=1)
    threading.Thread(target=relay.follow, args=(capture_native_stdout(),), daemon=True,
                     name="rpc-log").start()
    threading.Thread(target=serve_rpc, daemon=True, name="rpc-worker", args=(endpoint,), kwargs={
        "device": device, "cache_dir": cache_folder(settings),
        "n_threads": settings.threads or default_threads()}).start()
    _wait_until_answering(endpoint, stop)
    on_ready()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class ClientLog:
    """Turns the RPC server's own stdout into edgevlm's: one line per client that connects or
    leaves, and llama.cpp's banner only when asked for (verbose)."""

    CONNECTED, CLOSED = "Accepted client connection", "Client connection closed"

    def __init__(self, say: Callable[[str], None], *, verbose: bool, own_probes: int = 0) -> None:
        self._say, self._verbose = say, verbose
        self._skip = {self.CONNECTED: own_probes, self.CLOSED: own_probes}  # the readiness check's
        self.clients = 0

    def follow(self, stream: BinaryIO) -> None:
        """Read lines until the stream ends (the process exits)."""
        for raw in stream:
            self.line(raw.decode("utf-8", "replace").rstrip())

    def line(self, text: str) -> None:
        """One line llama.cpp printed."""
        if self._verbose:
            self._say(text)
            return
        if text not in self._skip:
            return
        if self._skip[text]:
            self._skip[text] -= 1
            return
        self.clients += 1 if text == self.CONNECTED else -1
        what = "a client connected" if text == self.CONNECTED else "a client left"
        self._say(f"{time.strftime('%H:%M:%S')} {what} ({max(self.clients, 0)} connected)")


def _wait_until_answering(endpoint: str, stop: threading.Event) -> None:
    for _ in range(100):
        try:
            hello(endpoint, timeout_s=1.0)
            return
        except ConfigError:
            if stop.wait(0.1):
                return
    raise ConfigError(f"the worker did not start listening on {endpoint}; see --verbose for llama.cpp's log")


def describe_device(device: str) -> str:
    """The device as a person reads it: name, what it is, its free memory."""
    found: list[BackendDevice] = [d for d in backend_devices() if d.name == device]
    if not found:
        return f"{device} (this machine's CPU and RAM)"
    d = found[0]
    return f"{d.name} ({d.description}, {d.free_bytes / (1 << 30):.1f} GiB free)"
