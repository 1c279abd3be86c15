"""Where edgevlm keeps things for the user: the XDG data and cache directories, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def check_writable(path: Path, flag: str, *, folder: bool = False) -> None:
    """Refuse, before any work, an output that cannot be created there: one under a file, or
    a folder that refuses writes (`folder`: the path is itself a folder to write into)."""
    from edgevlm.errors import UserError

    if folder and path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: is a file; give a folder")
    if not folder and path.is_dir():
        raise UserError(f"{flag} {path}: is a directory; give a file")
    existing = path if folder else path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, so nothing can be written under it; "
                        "choose a path in a folder")
    if not os.access(existing, os.W_OK):
        raise UserError(f"{flag} {path}: cannot write in {existing} (permission denied)")


def data_dir() -> Path:
    """$XDG_DATA_HOME/edgevlm (default ~/.local/share/edgevlm): sessions, history, models."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "edgevlm"


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/edgevlm (default ~/.cache/edgevlm): things that can be rebuilt."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgevlm"
