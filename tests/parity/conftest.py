"""The reference venv, for every parity test: skipped with the reason where it is not built,
failed where EDGEVLM_REQUIRE_PARITY is set (CI builds it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgevlm.parity.client import reference_python


@pytest.fixture(scope="module")
def reference() -> Path:
    python = reference_python()
    if python is None:
        reason = "needs the reference venv with torch CPU and transformers (make parity-env)"
        if os.environ.get("EDGEVLM_REQUIRE_PARITY"):
            pytest.fail(reason)  # CI builds it: a missing reference must not pass quietly
        pytest.skip(reason)
    return python
