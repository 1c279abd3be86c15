"""llama.cpp's RPC backend from edgevlm's side: endpoints, a safe first contact, what to tell users.

ggml aborts the whole process when an RPC worker cannot be reached or speaks another protocol
version, so every endpoint is checked here first, in Python, with the protocol's own HELLO
(ggml/src/ggml-rpc/ggml-rpc.cpp): one command byte, a 64-bit size, the request; the worker
answers with its version. A worker serves one client at a time, so a busy worker is reported
as such rather than waited on forever.
"""

from __future__ import annotations

import re
import socket
import struct

from edgevlm.errors import ConfigError

DEFAULT_PORT = 50052
PROTOCOL_MAJOR = 7  # RPC_PROTO_MAJOR_VERSION of the pinned llama.cpp
PROTOCOL_MINOR = 0
_HELLO = 14  # RPC_CMD_HELLO
_CAPS_BYTES = 24  # RPC_CONN_CAPS_SIZE: no transport upgrades offered
PREFLIGHT_TIMEOUT_S = 5.0


def parse_endpoints(text: str) -> list[str]:
    """--rpc HOST:PORT[,HOST:PORT…] as a list, each checked for shape."""
    endpoints = [part.strip() for part in text.split(",") if part.strip()]
    if not endpoints:
        raise ConfigError("--rpc: give at least one HOST:PORT (a worker started with edgevlm worker)")
    for endpoint in endpoints:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--rpc {endpoint}: expected HOST:PORT, e.g. 192.168.1.20:{DEFAULT_PORT}")
    if len(set(endpoints)) != len(endpoints):
        raise ConfigError("--rpc: the same worker is listed twice")
    return endpoints


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def hello(endpoint: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> tuple[int, int, int]:
    """The worker's protocol version, from the protocol's own HELLO; ConfigError if it cannot say."""
    try:
        with socket.create_connection(_split(endpoint), timeout=timeout_s) as sock:
            sock.sendall(struct.pack("<BQ", _HELLO, _CAPS_BYTES) + bytes(_CAPS_BYTES))
            size = struct.unpack("<Q", _read(sock, 8))[0]
            reply = _read(sock, size)
    except TimeoutError:
        raise ConfigError(f"--rpc {endpoint}: the worker did not answer within {timeout_s:.0f} s; it "
                          "serves one client at a time, so another program may be using it") from None
    except (OSError, EOFError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or "closed"
        raise ConfigError(f"--rpc {endpoint}: no RPC worker answers there ({reason}); start one on that "
                          f"machine with `edgevlm worker --port {_split(endpoint)[1]}`") from None
    return reply[0], reply[1], reply[2]


def _read(sock: socket.socket, n_bytes: int) -> bytes:
    data = b""
    while len(data) < n_bytes:
        chunk = sock.recv(n_bytes - len(data))
        if not chunk:
            raise EOFError("the worker closed the connection: it speaks another RPC protocol version")
        data += chunk
    return data


def preflight(endpoints: list[str]) -> None:
    """Every worker answers and speaks this build's protocol, or a one-line ConfigError (exit 2)."""
    for endpoint in endpoints:
        major, minor, patch = hello(endpoint)
        if major != PROTOCOL_MAJOR or minor > PROTOCOL_MINOR:
            raise ConfigError(
                f"--rpc {endpoint}: the worker speaks RPC protocol {major}.{minor}.{patch}, this edgevlm "
                f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}; workers must be built from the same llama.cpp: run "
                "`edgevlm worker` from the same edgevlm version, or `make rpc-server` from this checkout")


def lost_worker_message(endpoints: list[str], ggml_message: str) -> str:
    """What to say when ggml gives up on a worker mid-request (it then ends the process)."""
    where = ", ".join(endpoints)
    ggml_message = re.sub(r"^\S+:\d+: ", "", ggml_message)  # ggml's source file and line
    return (f"error: lost the RPC worker ({where}): {ggml_message or 'the connection dropped'}. "
            "Restart the worker (edgevlm worker) and run the command again; chat sessions are "
            "saved after every turn, so `edgevlm chat --resume` picks up where the last answer ended.")


def worker_hint(host: str, port: int) -> str:
    """What to pass to clients of a worker listening on host:port."""
    shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
    return f"--rpc {shown}:{port}"
