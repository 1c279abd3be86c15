"""The Makefile explains itself (`make help` names every target), and the package builds quietly."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_target() -> None:
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert phony is not None
    shown = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout
    listed = {line.split()[1] for line in shown.splitlines() if line.startswith("make ")}
    assert set(phony.group(1).split()) - {"help"} <= listed


def test_the_package_builds_without_setuptools_warnings(tmp_path: Path) -> None:
    """`make setup` stays quiet: the packaging metadata gives setuptools nothing to warn about."""
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                             "--disable-pip-version-check", "-w", str(tmp_path), str(ROOT)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stdout + result.stderr, result.stdout + result.stderr
    wheel = next(tmp_path.glob("edgevlm-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert "edgevlm/server/static/index.html" in names and "edgevlm/describe/exiftool.config" in names
