"""Listening safely: what counts as this machine only, and whether a port is free, in one place."""

from __future__ import annotations

import ipaddress
import socket

from edgevlm.errors import ConfigError


def is_loopback(host: str) -> bool:
    """Whether the address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """Fail before anything loads if the address cannot be listened on."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port {port} is not a TCP port (1-65535)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); another "
                              "program may be using it: pick another --port") from None
