"""Shared fixtures: the generated test models (never downloaded) and engines on them."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
# Property tests check what pure code returns, never how fast: hypothesis's 200 ms deadline is a
# timed assertion, and on a loaded 2-core machine one case of a video plan (40,000 sampled times)
# took 256 ms once and 112 ms when hypothesis ran it again, failing the suite as "flaky".
settings.register_profile("edgevlm", deadline=None)
settings.load_profile("edgevlm")
TEST_MODELS = ROOT / "models" / "test"


def _test_model_files() -> dict[str, Path]:
    """scripts/test_models.tsv: each test model's key and file (what the writer makes)."""
    rows = (line.split() for line in (ROOT / "scripts" / "test_models.tsv").read_text().splitlines())
    return {row[0]: TEST_MODELS / row[1] for row in rows if row and not row[0].startswith("#")}


MODEL_FILES = _test_model_files()
TEXT_MODEL = MODEL_FILES["text"]  # SmolLM2-135M: the text model of every LLaVA-style pair
MMPROJ_336 = MODEL_FILES["mmproj_336"]  # 576 tokens per image, like LLaVA-1.5
MMPROJ_112 = MODEL_FILES["mmproj_112"]  # 64 tokens per image, for fast CLI runs
MMPROJ_NEXT = MODEL_FILES["mmproj_next"]
QWEN_TEXT, QWEN_MMPROJ = MODEL_FILES["qwen_text"], MODEL_FILES["qwen_mmproj"]
QWEN3_TEXT, QWEN3_MMPROJ = MODEL_FILES["qwen3_text"], MODEL_FILES["qwen3_mmproj"]
GEMMA_TEXT, GEMMA_MMPROJ = MODEL_FILES["gemma_text"], MODEL_FILES["gemma_mmproj"]
SMOLVLM_TEXT, SMOLVLM_MMPROJ = MODEL_FILES["smolvlm_text"], MODEL_FILES["smolvlm_mmproj"]
GEMMA4_TEXT, GEMMA4_MMPROJ = MODEL_FILES["gemma4_text"], MODEL_FILES["gemma4_mmproj"]
LFM2_TEXT, LFM2_MMPROJ = MODEL_FILES["lfm2_text"], MODEL_FILES["lfm2_mmproj"]

def load_script(name: str) -> ModuleType:
    """A module from scripts/ (the test-model writers), imported without touching sys.path."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses in the script look their module up by name
    spec.loader.exec_module(module)
    return module


def _ensure_test_models() -> None:
    if not all(path.exists() for path in MODEL_FILES.values()):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_test_models.py")], check=True)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs a worker per core and one more), each worker keeps to
    one core, and so do the commands it starts: llama.cpp's threads spin while they wait, and two
    engines of two threads each on two cores ran several times slower than one. One thread per
    engine never spins, so two workers may share a core (the extra one fills the others' waits)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and count > 1 and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        index = int(worker[2:])
        os.sched_setaffinity(0, cores[index::count] or [cores[index % len(cores)]])


@pytest.fixture(scope="session")
def test_models() -> dict[str, Path]:
    """Paths of the generated test models."""
    _ensure_test_models()
    return dict(MODEL_FILES)


def make_engine(mmproj: Path, *, n_ctx: int = 2048, n_batch: int = 512,  # noqa: ANN201
                text: Path = TEXT_MODEL, swa_full: bool = True):
    """A CPU engine on the test text model (or `text`) and the given projector."""
    from edgevlm.llama.engine import Engine
    from edgevlm.llama.types import EngineConfig

    return Engine(EngineConfig(text, mmproj, n_ctx=n_ctx, n_gpu_layers=0, n_batch=n_batch,
                               n_ubatch=n_batch, swa_full=swa_full))


def make_describer(sequence: object, fmt: object, *, tile_size: int, layout: object = None,  # noqa: ANN201
                   encoder: object = None, prefix_cache: object = None, n_gpu_layers: int = 0,
                   output: object = None, **settings: object):
    """A describer on this sequence, made as the faces make one (runtime.conversations)."""
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.chat.structured import TEXT
    from edgevlm.runtime.conversations import ModelSide, new_describer

    return new_describer(sequence, ModelSide(fmt, tile_size, layout), ChatSettings(**settings),
                         output=output or TEXT, n_gpu_layers=n_gpu_layers, encoder=encoder,
                         prefix_cache=prefix_cache)


def make_conversation(sequence: object, fmt: object, *, tile_size: int, layout: object = None,  # noqa: ANN201
                      encoder: object = None, prefix_cache: object = None, **settings: object):
    """A conversation with these settings (ChatSettings' fields), as runtime.conversations makes one."""
    from edgevlm.chat.conversation import Conversation
    from edgevlm.chat.settings import ChatSettings

    return Conversation(sequence, fmt, tile_size=tile_size, settings=ChatSettings(**settings),
                        layout=layout, encoder=encoder, prefix_cache=prefix_cache)


@contextlib.contextmanager
def one_sequence(mmproj: Path, **sizes: int) -> Iterator[object]:
    """Sequence 0 of a fresh CPU engine (make_engine's), closed after the block."""
    with make_engine(mmproj, **sizes) as engine:
        yield engine.sequence()


@pytest.fixture(scope="module")
def sequence(test_models: dict[str, Path]) -> Iterator[object]:
    """Sequence 0 of a 2048-token engine with the 576-token projector, shared within a module."""
    eng = make_engine(test_models["mmproj_336"])
    yield eng.sequence()
    eng.close()


@pytest.fixture(scope="module")
def small_sequence(test_models: dict[str, Path]) -> Iterator[object]:
    """Sequence 0 of a 1024-token engine with the 64-token projector."""
    eng = make_engine(test_models["mmproj_112"], n_ctx=1024)
    yield eng.sequence()
    eng.close()


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the real user's data or the network."""
    home = tmp_path_factory.getbasetemp() / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches its price list at import
    # CLIP counts in tests mean what they say: the image cache is on only where a test asks.
    monkeypatch.setenv("EDGEVLM_NO_CACHE", "1")
    monkeypatch.delenv("EDGEVLM_MODEL", raising=False)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `edgevlm ARGS` in a subprocess, as a user would."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "edgevlm.cli", *args], capture_output=True,
                          text=True, env=full_env, timeout=timeout, input=stdin)


def invoke_cli(*args: str, env: dict[str, str] | None = None,
               stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`edgevlm ARGS` in this process (Typer's CliRunner), answered as run_cli answers: for the
    flags, the errors and what the faces print, with loading as the test arranges (fake_engines).
    A few tests still run the real command as a subprocess (run_cli)."""
    from typer.testing import CliRunner

    from edgevlm.cli.app import app

    result = CliRunner().invoke(app, list(args), env={"HF_HUB_OFFLINE": "1", **(env or {})}, input=stdin,
                                obj=_CLI_ENGINE[0] if _CLI_ENGINE else None)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback is a failure to see whole, not an exit code
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


_CLI_ENGINE: list[object] = []  # the engine maker invoke_cli hands the app (fake_engines sets it)


@pytest.fixture()
def fake_engines() -> Iterator[None]:
    """Commands run by invoke_cli load their models as FakeEngines (tests/fakes.py): the real files'
    facts and plan, every family's layout, no llama.cpp. The fake is handed to the app as its
    object, as the composition root takes an engine maker (runtime.loading.load's `engine`)."""
    from .fakes import fake_engine

    _CLI_ENGINE.append(fake_engine)
    try:
        yield
    finally:
        _CLI_ENGINE.clear()
