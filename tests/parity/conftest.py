"""The reference venv, for every parity test: skipped with the reason where it is not built,
failed where EDGEVLM_REQUIRE_PARITY is set (CI builds it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgevlm.parity.client import reference_python


def skip_or_fail(reason: str) -> None:
    """Skip for a part of the reference this machine has not built; fail where CI builds it
    (EDGEVLM_REQUIRE_PARITY): a missing reference must not pass quietly."""
    if os.environ.get("EDGEVLM_REQUIRE_PARITY"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def reference() -> Path:
    python = reference_python()
    if python is None:
        skip_or_fail("needs the reference venv with torch CPU and transformers (make parity-env)")
    assert python is not None
    return python
