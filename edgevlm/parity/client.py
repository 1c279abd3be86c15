"""edgevlm's side of a parity check: finds the reference venv and asks it (reference.py) in a
process of its own, so that torch and transformers never load into edgevlm's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgevlm.errors import ConfigError

# Where `make parity-env` puts the reference venv, under the repository root.
PARITY_VENV = ".venv-parity"
# Importing torch and transformers takes seconds on 2 cores; a stage's answer more.
REFERENCE_TIMEOUT_S = 600


def reference_python(root: Path | None = None) -> Path | None:
    """The python that runs the reference: $EDGEVLM_PARITY_PYTHON, else .venv-parity under the
    repository root, else this one where transformers is installed beside edgevlm (the
    edgevlm[parity] extra); None where there is none."""
    named = os.environ.get("EDGEVLM_PARITY_PYTHON")
    if named:
        return Path(named) if Path(named).exists() else None
    base = root or Path(__file__).resolve().parents[2]
    python = base / PARITY_VENV / "bin" / "python"
    if python.exists():
        return python
    return Path(sys.executable) if importlib.util.find_spec("transformers") is not None else None


def ask_reference(python: Path, request: dict[str, Any]) -> dict[str, Any]:
    """The reference's answer to one request (see reference.py); ConfigError naming the stage
    when it has none or fails."""
    package_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(package_root), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run([str(python), "-m", "edgevlm.parity.reference"], input=json.dumps(request),
                          capture_output=True, text=True, env=env, timeout=REFERENCE_TIMEOUT_S, check=False)
    try:
        answer: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        stage = request.get("stage")
        raise ConfigError(f"the reference ({python}) failed on stage {stage}: {last}") from None
    if done.returncode != 0 or "error" in answer:
        raise ConfigError(f"the reference ({python}): {answer.get('error', done.stderr.strip()[-300:])}")
    return answer
