"""The house's shape: folders by concern, one llama.cpp importer, pure modules, small units."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "edgevlm"
MODULES = sorted(PACKAGE.rglob("*.py"))
# The top level holds the package's face and small shared leaves only; every concern is a folder.
TOP_LEVEL = {"__init__.py", "__main__.py", "errors.py", "paths.py", "network.py", "interrupts.py"}
PURE = ["edgevlm.vision.tiling", "edgevlm.vision.layout", "edgevlm.families", "edgevlm.families.llava15",
        "edgevlm.families.llava_next", "edgevlm.families.mtmd", "edgevlm.families.qwen_vl",
        "edgevlm.models.memory_kinds", "edgevlm.values.sampling", "edgevlm.values.embedding",
        "edgevlm.values.stats", "edgevlm.values.merging", "edgevlm.planning.values",
        "edgevlm.planning.arithmetic",
        "edgevlm.planning.media_costs", "edgevlm.planning.planner", "edgevlm.planning.verify",
        "edgevlm.planning.split", "edgevlm.planning.devices", "edgevlm.models.catalog",
        "edgevlm.models.gguf", "edgevlm.llama.types", "edgevlm.store.caches", "edgevlm.chat.resent",
        "edgevlm.server.fields", "edgevlm.vision.documents", "edgevlm.vision.video",
        "edgevlm.vision.sources", "edgevlm.llama.numbers", "edgevlm.chat.structured",
        "edgevlm.parity.client", "edgevlm.parity.check"]
MAX_FUNCTION_LINES = 50
# Text architectures that share a name with a projector type (Gemma 3's, LFM2's).
_TEXT_ARCHS = {"gemma3", "lfm2"}


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


def test_only_the_reference_runner_imports_transformers_or_torch() -> None:
    """transformers and torch run in the reference venv only, through parity/reference.py as a
    program of its own: nothing edgevlm loads imports them."""
    importers = {path.relative_to(PACKAGE).as_posix() for path in MODULES
                 if any(name.split(".")[0] in ("torch", "transformers") for name in _imports(_tree(path)))}
    assert importers == {"parity/reference.py"}


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


def test_functions_stay_small() -> None:
    too_long = {}
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES):
                name = f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"
                too_long[name] = node.end_lineno - node.lineno + 1
    assert too_long == {}


def _project_classes() -> set[str]:
    return {node.name for path in MODULES for node in ast.walk(_tree(path)) if isinstance(node, ast.ClassDef)}


def test_no_class_is_split_over_project_base_classes() -> None:
    """Compose, do not inherit to split a class: a class has at most one of the project's bases."""
    ours = _project_classes()
    split = {}
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            # a protocol that is the union of its parts is no split
            if isinstance(node, ast.ClassDef) and not _is_protocol(node):
                bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in ours]
                if len(bases) > 1:
                    split[f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"] = bases
    assert split == {}


def test_no_stubs_of_sibling_methods_under_type_checking() -> None:
    """A TYPE_CHECKING block may import a type; it never declares methods another class provides."""
    stubs = []
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                    and node.test.id == "TYPE_CHECKING"):
                stubs += [f"{path.relative_to(PACKAGE).as_posix()}:{n.name}" for n in node.body
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert stubs == []


def _module_imports() -> dict[str, set[str]]:
    """Each module's project imports, by dotted name (lazy imports inside functions too)."""
    found = {}
    for path in MODULES:
        name = ".".join(("edgevlm", *path.relative_to(PACKAGE).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = {i for i in _imports(_tree(path)) if i.startswith("edgevlm.")}
    return found


def test_the_chat_and_llama_folders_hold_no_import_circle() -> None:
    imports = _module_imports()
    for folder in ("edgevlm.chat.", "edgevlm.llama."):
        inside = {m: {i for i in deps if i.startswith(folder)} for m, deps in imports.items()
                  if m.startswith(folder)}
        circles = [(a, b) for a, deps in inside.items() for b in deps if a in inside.get(b, set())]
        assert circles == [], circles


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "(top)"  # edgevlm.errors and friends are shared leaves


def test_no_folder_imports_a_folder_that_imports_it_back() -> None:
    """Folders are floors: the facts (models/) below vision/ and planning/, the composition root
    (runtime/) above them; an arrow both ways between two folders is a floor in the wrong place."""
    arrows: dict[str, set[str]] = defaultdict(set)
    for module, deps in _module_imports().items():
        arrows[_folder(module)] |= {_folder(d) for d in deps} - {_folder(module), "(top)"}
    both_ways = sorted((a, b) for a, targets in arrows.items() for b in targets if a < b and a in arrows[b])
    assert both_ways == [], both_ways
    core = ("chat", "describe", "vision", "planning", "models", "store", "llama")
    assert "runtime" not in set().union(*(arrows[f] for f in core))


def test_conversations_are_made_in_one_place() -> None:
    """The composition root builds every Conversation; the faces hand it settings."""
    makers = [path.relative_to(PACKAGE).as_posix() for path in MODULES
              for node in ast.walk(_tree(path))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "Conversation"]
    assert makers == ["runtime/conversations.py"]


def test_only_the_families_folder_knows_projector_types() -> None:
    """A family's knowledge is in its file: outside families/, nothing tests a projector's type
    or keeps a list or table of types (nor the old lists by name); everything asks
    families.family_for(projector)."""
    from edgevlm.families import FAMILIES

    kinds = set().union(*(family.projector_types for family in FAMILIES))
    named = {}
    for path in MODULES:
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("families/"):
            continue
        found = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "projector_type"
                    for side in (node.left, *node.comparators)):
                found.add(f"line {node.lineno}: a test of projector_type")
            elif isinstance(node, (ast.Set, ast.List, ast.Tuple, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                listed = {i.value for i in items if isinstance(i, ast.Constant) and i.value in kinds}
                if len(listed) >= 2 and listed <= kinds - _TEXT_ARCHS:
                    found.add(f"line {node.lineno}: a list of projector types")
            elif isinstance(node, ast.Name) and node.id in ("LLAVA_PROJECTORS", "MTMD_VISION_PROJECTORS"):
                found.add(node.id)
        if found:
            named[where] = sorted(found)
    assert named == {}


def test_the_planner_is_handed_what_the_chat_and_the_stores_keep() -> None:
    """planning/ counts checkpoints and prefixes it is handed (RamKeeps): it imports neither."""
    imports = _module_imports()
    reaching = {m: sorted(d for d in deps if _folder(d) in ("chat", "store"))
                for m, deps in imports.items() if m.startswith("edgevlm.planning")}
    assert {m: deps for m, deps in reaching.items() if deps} == {}


def test_the_faces_reach_llama_cpp_only_through_the_composition_root() -> None:
    """cli/ and server/ name no edgevlm.llama module: values live in values/, loading in runtime/."""
    imports = _module_imports()
    faces = {m: sorted(d for d in deps if d.startswith("edgevlm.llama"))
             for m, deps in imports.items() if _folder(m) in ("cli", "server")}
    assert {m: deps for m, deps in faces.items() if deps} == {}


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases)


def test_layouts_are_asked_what_they_do_not_what_they_are() -> None:
    """Outside families/, nothing reads a layout's or a family's old kind flags (native, packed):
    a layout writes its own block, and is asked what it does (cuts_tiles, numbers_images, …)."""
    found = []
    for path in MODULES:
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("families/"):
            continue
        found += [f"{where}:{node.lineno} .{node.attr}" for node in ast.walk(_tree(path))
                  if isinstance(node, ast.Attribute) and node.attr in ("native", "packed")]
    assert found == []


def test_no_method_is_a_stub_that_raises_not_implemented() -> None:
    """A protocol method no implementation can honour (raising NotImplementedError) means the
    protocol is wrong: no class implements one that way."""
    stubs = []
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef):
                for method in node.body:
                    if isinstance(method, ast.FunctionDef) and any(
                            isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n)
                            for n in ast.walk(method)):
                        stubs.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.name}.{method.name}")
    assert stubs == []


MAX_PARAMETERS = 12  # a hint, as the function size is: past it, a group of options wants a value


def test_functions_take_values_not_packed_tuples_or_long_lists() -> None:
    """No parameter is an untyped tuple (`tuple[object, ...]` unpacked by index: describe's
    settings were passed that way), and no function takes more than MAX_PARAMETERS, except the
    commands, whose parameters are the command line's options (Typer declares them so)."""
    found = []
    for path in MODULES:
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(_tree(path)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            for arg in args:
                note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if note.replace(" ", "") in ("tuple", "tuple[object,...]", "tuple[Any,...]"):
                    found.append(f"{where}:{node.name}({arg.arg}: {note})")
            command = any(ast.unparse(d).startswith("app.command") for d in node.decorator_list)
            named = [a for a in args if a.arg not in ("self", "cls")]
            if len(named) > MAX_PARAMETERS and not command:
                found.append(f"{where}:{node.name} takes {len(named)}")
    assert found == []


def test_every_type_ignore_names_its_code_and_its_reason() -> None:
    """mypy checks edgevlm/ and the fake (`make lint`); a silenced error says which and why."""
    import re

    bare = []
    for path in [*MODULES, PACKAGE.parent / "tests" / "fakes.py"]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in line and not re.search(r"type: ignore\[[-a-z, ]+\]  # \w", line):
                bare.append(f"{path.name}:{number}")
    assert bare == []
