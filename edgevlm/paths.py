"""Where edgevlm keeps things for the user: the XDG data and cache directories, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """$XDG_DATA_HOME/edgevlm (default ~/.local/share/edgevlm): sessions, history, models."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "edgevlm"


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/edgevlm (default ~/.cache/edgevlm): things that can be rebuilt."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgevlm"
