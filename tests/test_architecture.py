"""The house's shape: folders by concern, one llama.cpp importer, pure modules, small units."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgevlm"
MODULES = sorted(PACKAGE.rglob("*.py"))
# The top level holds the package's face and small shared leaves only; every concern is a folder.
TOP_LEVEL = {"__init__.py", "__main__.py", "entry.py", "errors.py", "paths.py", "network.py"}
PURE = ["edgevlm.vision.tiling", "edgevlm.vision.layout", "edgevlm.vision.llava15",
        "edgevlm.vision.llava_next", "edgevlm.vision.registry", "edgevlm.planning.memory",
        "edgevlm.planning.split", "edgevlm.planning.devices", "edgevlm.models.catalog",
        "edgevlm.models.gguf", "edgevlm.llama.types", "edgevlm.store.caches", "edgevlm.chat.resent",
        "edgevlm.server.fields"]
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 50


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_only_the_llama_folder_imports_llama_cpp() -> None:
    importers = {path.relative_to(PACKAGE).as_posix() for path in MODULES
                 if any(name.split(".")[0] == "llama_cpp" for name in _imports(_tree(path)))}
    assert importers and all(name.startswith("llama/") for name in importers), importers


def test_every_concern_is_a_folder() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} <= TOP_LEVEL


def test_pure_modules_do_not_load_libllama() -> None:
    probe = (f"import sys\nimport {', '.join(PURE)}\n"
             "print(sorted(m for m in sys.modules if m.startswith('llama_cpp')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_no_two_classes_share_a_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(path.relative_to(PACKAGE).as_posix())
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


@pytest.mark.parametrize("kind, limit", [(ast.ClassDef, MAX_CLASS_LINES),
                                         ((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION_LINES)])
def test_units_stay_small(kind: type | tuple[type, ...], limit: int) -> None:
    too_long = {}
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, kind) and node.end_lineno - node.lineno + 1 > limit:
                name = f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"
                too_long[name] = node.end_lineno - node.lineno + 1
    assert too_long == {}
