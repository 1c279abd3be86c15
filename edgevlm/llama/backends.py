"""ggml's devices, and llama.cpp's RPC backend (ggml-rpc): what layers can go on, and workers."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import llama_cpp

from edgevlm.errors import EngineError
from edgevlm.llama.logs import NATIVE_LOG
from edgevlm.llama.types import BackendDevice

_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type
# ggml through libllama's own handle: the wheel ships libggml under several file names, and a
# second dlopen by another name would be a second ggml with its own (empty) device registry.
_ggml = llama_cpp.llama_cpp._lib
_P = ctypes.c_void_p


def _bind(name: str, argtypes: list[type], restype: type | None) -> Callable[..., Any]:
    """A ggml function with its C signature; what it returns is what `restype` makes of it."""
    fn = getattr(_ggml, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


_dev_count = _bind("ggml_backend_dev_count", [], ctypes.c_size_t)
_dev_get = _bind("ggml_backend_dev_get", [ctypes.c_size_t], _P)
_dev_by_name = _bind("ggml_backend_dev_by_name", [ctypes.c_char_p], _P)
_dev_name = _bind("ggml_backend_dev_name", [_P], ctypes.c_char_p)
_dev_description = _bind("ggml_backend_dev_description", [_P], ctypes.c_char_p)
_dev_type = _bind("ggml_backend_dev_type", [_P], ctypes.c_int)
_dev_memory = _bind("ggml_backend_dev_memory", [_P, ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)], None)
_dev_reg = _bind("ggml_backend_dev_backend_reg", [_P], _P)
_reg_name = _bind("ggml_backend_reg_name", [_P], ctypes.c_char_p)
_register = _bind("ggml_backend_register", [_P], None)
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_set_abort = _bind("ggml_set_abort_callback", [_ABORT_CALLBACK], _ABORT_CALLBACK)
_rpc_registered: dict[str, list[str]] = {}  # endpoint -> its devices' names, once per process
_abort_callbacks: list[object] = []  # ctypes callbacks must outlive their use


def _describe(dev: int) -> BackendDevice:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    kind = _DEVICE_KINDS.get(int(_dev_type(dev)), "gpu")
    if (_reg_name(_dev_reg(dev)) or b"") == b"RPC":
        kind = "rpc"
    return BackendDevice((_dev_name(dev) or b"").decode(), (_dev_description(dev) or b"").decode(),
                         int(free.value), int(total.value), kind)


def backend_devices() -> list[BackendDevice]:
    """The devices a model can be offloaded to, in llama.cpp's order: RPC workers, then GPUs."""
    llama_cpp.llama_backend_init()
    found = [_describe(_dev_get(i)) for i in range(int(_dev_count()))]
    offload = [d for d in found if d.kind in ("gpu", "igpu", "rpc")]
    return [d for d in offload if d.kind == "rpc"] + [d for d in offload if d.kind != "rpc"]


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can put layers on a GPU of this machine (llama.cpp's own
    llama_supports_gpu_offload also says yes for a CPU build with the RPC backend)."""
    return any(d.kind in ("gpu", "igpu") for d in backend_devices())


def rpc_supported() -> bool:
    """Whether this llama.cpp build has ggml's RPC backend (built with -DGGML_RPC=on)."""
    return bool(llama_cpp.llama_supports_rpc())


def add_rpc_servers(endpoints: list[str]) -> list[BackendDevice]:
    """Register RPC workers (HOST:PORT, already known to answer) as llama.cpp devices.

    ggml aborts the process on a worker it cannot reach or that speaks another protocol
    version, so callers check each endpoint first (see rpc.endpoints.preflight).
    """
    llama_cpp.llama_backend_init()
    add = _bind("ggml_backend_rpc_add_server", [ctypes.c_char_p], _P)
    count = _bind("ggml_backend_reg_dev_count", [_P], ctypes.c_size_t)
    get = _bind("ggml_backend_reg_dev_get", [_P, ctypes.c_size_t], _P)
    names: list[str] = []
    for endpoint in endpoints:
        if endpoint not in _rpc_registered:
            reg = add(endpoint.encode())
            if not reg:
                raise EngineError(f"RPC worker {endpoint}: llama.cpp could not add it "
                                  f"({NATIVE_LOG.error_hint()})")
            _register(reg)
            _rpc_registered[endpoint] = [_describe(get(reg, i)).name for i in range(int(count(reg)))]
        names += _rpc_registered[endpoint]
    return [d for d in backend_devices() if d.name in names]


def serve_rpc(endpoint: str, *, device: str, cache_dir: Path | None, n_threads: int) -> None:
    """Run ggml's RPC server on this process until it is killed (llama.cpp's own worker loop)."""
    llama_cpp.llama_backend_init()
    dev = device_by_name(device)
    start = _bind("ggml_backend_rpc_start_server",
                  [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(_P)],
                  None)
    devices = (_P * 1)(dev)
    start(endpoint.encode(), str(cache_dir).encode() if cache_dir else None, n_threads, 1, devices)


def capture_native_stdout() -> BinaryIO:
    """Send what llama.cpp's C code prints to stdout (the RPC server's banner and connection
    lines) into a pipe, line-buffered, and return its reading end; Python's own stdout is kept."""
    sys.stdout.flush()
    kept = os.dup(1)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.close(write_fd)
    sys.stdout = open(kept, "w", buffering=1, encoding=sys.stdout.encoding or "utf-8")  # noqa: SIM115
    try:  # C stdio would buffer a pipe in 4 KiB blocks: lines must come as they are printed
        libc = ctypes.CDLL(None)
        libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), None, 1, 0)  # _IOLBF
    except (OSError, ValueError, AttributeError):
        pass  # not glibc: the lines come later, in blocks
    return os.fdopen(read_fd, "rb")


def device_by_name(name: str) -> int:
    """ggml's handle for a device by its name (CUDA0, RPC1, CPU)."""
    llama_cpp.llama_backend_init()
    dev = _dev_by_name(name.encode())
    if not dev:
        known = ", ".join(["CPU", *(d.name for d in backend_devices())])
        raise EngineError(f"no llama.cpp device named '{name}' (this machine has: {known})")
    return dev


def on_backend_abort(handler: Callable[[str], None]) -> None:
    """Call handler with ggml's message before ggml aborts the process (a lost RPC worker, say).

    ggml aborts whatever the callback does; the handler gets the last word (a clear message,
    then its own exit), instead of a core dump.
    """
    def called(message: bytes | None) -> None:
        handler((message or b"").decode("utf-8", "replace").strip())

    callback = _ABORT_CALLBACK(called)
    _abort_callbacks[:] = [callback]
    _set_abort(callback)
