"""The Makefile explains itself (`make help` names every target). The package's quiet build is
checked by `make lint` (scripts/check_package.py): building a wheel is no test of the code."""

from __future__ import annotations

import re
import shutil
import subprocess

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
