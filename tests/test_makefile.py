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


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_every_prerequisite_is_named_when_make_reads_its_rule() -> None:
    """make expands a rule's prerequisites as it reads the rule: a variable defined further down is
    empty there. `parity-env` once named `$(PEER_SRC)` above its definition, and a clean clone's
    CI never unpacked llama.cpp's converter (every parity test then failed)."""
    database = subprocess.run(["make", "-n", "-p", "help"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    rule = re.search(r"^parity-env:(.*)$", database, re.MULTILINE)
    assert rule is not None
    assert "peers/src/llama_cpp_python-" in rule.group(1)
    source = (ROOT / "Makefile").read_text().splitlines()
    defined = {m.group(1): n for n, line in enumerate(source)
               if (m := re.match(r"^\s*([A-Z_]+)\s*[:?]?=", line))}
    for n, line in enumerate(source):
        if re.match(r"^[^\t#=]*:(?!=)", line):  # a rule line (targets: prerequisites)
            for name in re.findall(r"\$\(([A-Z_]+)\)", line):
                assert defined.get(name, -1) < n, f"Makefile:{n + 1} names $({name}) before it is defined"
