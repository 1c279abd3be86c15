"""JSON answers: schemas the grammar can enforce, and 20 photos whose --tags answers all parse strictly."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.structured import (
    OutputFormat,
    choose_format,
    grammar_schema,
    load_schema,
    tags_schema,
    unenforced,
)
from edgevlm.errors import ConfigError

from ..conftest import run_cli


def test_keywords_the_grammar_cannot_enforce_are_found_but_names_are_not() -> None:
    assert unenforced({"properties": {"multipleOf": {"type": "string"}}}) is None
    stepped = {"properties": {"n": {"type": "integer", "multipleOf": 3}}}
    assert unenforced(stepped) == ("multipleOf", "#/properties/n")
    assert unenforced({"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]}) == ("not", "#/anyOf/1")
    assert unenforced(tags_schema(8)) is None


def test_a_schema_file_is_checked_before_anything_loads(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}')
    with pytest.raises(ConfigError, match="no rule for 'multipleOf'"):
        load_schema(bad)
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_schema(bad)
    bad.write_text('{"type": 12}')
    with pytest.raises(ConfigError, match="not a valid JSON Schema"):
        load_schema(bad)


@pytest.mark.parametrize("bound", [1001, 2000, 100_000, 10**9])
def test_huge_length_and_item_bounds_build_a_small_grammar_at_once(bound: int) -> None:
    """Issue 39.5: a pydantic Field(max_length=2000) gave a 500; 10^5 a SIGSEGV; 10^9 a hang."""
    import time

    schema = {"type": "object", "required": ["s", "xs"], "properties": {
        "s": {"type": "string", "maxLength": bound},
        "xs": {"type": "array", "items": {"type": "string", "maxLength": bound}, "maxItems": bound}}}
    began = time.perf_counter()
    gbnf = OutputFormat("schema", schema).grammar()
    assert gbnf is not None and len(gbnf) < 40_000 and time.perf_counter() - began < 5
    assert OutputFormat("schema", schema).parse('{"s": "ab", "xs": ["c"]}') == {"s": "ab", "xs": ["c"]}
    with pytest.raises(ConfigError, match="more than a grammar can require"):
        OutputFormat("schema", {"type": "string", "minLength": bound}).grammar()


def test_bounds_emoji_and_odd_names_become_grammars_llama_cpp_parses() -> None:
    """Issue 39.8/9: ge/le were refused, emoji came out as U+FFFD, a name with a quote, newline
    or backslash and a regex backreference gave 500s, and contradictions were accepted."""
    age = grammar_schema({"type": "integer", "minimum": 0, "exclusiveMaximum": 151})
    assert age == {"type": "integer", "minimum": 0, "maximum": 150}  # held by digits (llama/numbers.py)
    assert grammar_schema({"type": "number", "minimum": 0.5}) == {"type": "number", "minimum": 0.5}
    assert grammar_schema({"type": "string", "minimum": 0.5}) == {"type": "string"}  # no number: dropped
    emoji = OutputFormat("schema", {"enum": ["😀 yes", "no"]}).grammar() or ""
    assert "😀 yes" in emoji and "\\ud83d" not in emoji.lower() and "\ud83d" not in emoji.lower()
    names = {"type": "object", "required": ['a"b', "c\nd", "e\\f"],
             "properties": {'a"b': {"type": "string"}, "c\nd": {"type": "integer"}, "e\\f": {"const": 1}}}
    assert OutputFormat("schema", names).grammar()
    for refused, why in [({"type": "string", "pattern": "^(a)\\1$"}, "cannot parse"),
                         ({"type": "string", "minLength": 5, "maxLength": 2}, "no answer can follow"),
                         ({"type": "integer", "minimum": 3, "maximum": 1}, "no answer can follow"),
                         ({"enum": []}, "no answer can follow")]:
        with pytest.raises(ConfigError, match=why):
            OutputFormat("schema", refused).grammar()


def test_one_output_shape_at_a_time(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--format json and --tags"):
        choose_format(fmt="json", schema_path=None, tags=True)
    assert choose_format(fmt=None, schema_path=None, tags=False).kind == "text"
    french = choose_format(fmt=None, schema_path=None, tags=True, language="French")
    assert "in French" in (french.prompt or "")


def _noise_folder(folder: Path, count: int) -> None:
    folder.mkdir()
    for i in range(count):
        rng = np.random.default_rng(i)
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(folder / f"IMG_{i:02}.png")


@pytest.mark.slow
def test_a_folder_of_photos_with_tags_all_parse_strictly_and_validate(test_models: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    _noise_folder(tmp_path / "photos", 4)  # four different random answers under the grammar
    done = run_cli("describe", str(tmp_path / "photos"), "--tags", "--max-tags", "3", "--json",
                   "--tiles", "0", "--model", str(test_models["text"]),
                   "--mmproj", str(test_models["mmproj_112"]), "--n-ctx", "2048", timeout=900)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line, strict=True) for line in done.stdout.splitlines()]
    assert len(rows) == 4
    for row in rows:  # random words, but every answer follows the schema: the grammar's doing
        jsonschema.validate(row["data"], tags_schema(3))
        assert json.loads(row["text"], strict=True) == row["data"]  # no raw control characters


@pytest.mark.skipif(shutil.which("exiftool") is None, reason="ExifTool is not installed")
def test_xmp_for_a_folder_and_a_rerun_that_skips_it(test_models: dict[str, Path], tmp_path: Path) -> None:
    _noise_folder(tmp_path / "photos", 2)
    args = ("describe", str(tmp_path / "photos"), "--write-xmp", "--max-tokens", "8", "--tiles", "0",
            "--model", str(test_models["text"]), "--mmproj", str(test_models["mmproj_112"]))
    first = run_cli(*args)
    assert first.returncode == 0 and "2 captioned" in first.stderr, first.stderr
    sidecar = tmp_path / "photos" / "IMG_00.png.xmp"
    read = subprocess.run(["exiftool", "-j", "-XMP-dc:Description", str(sidecar)],
                          capture_output=True, text=True, check=True)
    assert "Description" in json.loads(read.stdout)[0]
    again = run_cli(*args)
    assert again.returncode == 0 and "0 captioned, 2 skipped" in again.stderr, again.stderr
    changed = run_cli(*args, "--prompt", "Something else?")  # other settings: written again
    assert "2 captioned" in changed.stderr


def test_the_grammar_keeps_control_characters_out_of_strings() -> None:
    """Every character rule the schema grammar uses excludes raw control characters (the
    answers themselves are parsed strictly in the --tags and client tests)."""
    from edgevlm.llama.grammar import json_grammar

    grammar = json_grammar({"type": "object", "required": ["caption", "code"], "properties": {
        "caption": {"type": "string", "maxLength": 40}, "code": {"type": "string", "pattern": "^a.b$"}}})
    rules = dict(line.split(" ::= ", 1) for line in grammar.splitlines())
    assert rules["char"].startswith('[^"\\\\\\x7F\\x00-\\x1F]')
    assert rules["dot"] == '[^"\\\\\\x7F\\x00-\\x1F]'
    assert "[^\"\\\\]" not in grammar  # the converter's own, looser rule is gone


def test_a_recursive_schema_is_refused_by_name() -> None:
    from edgevlm.chat.structured import OutputFormat

    node = {"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
            "$ref": "#/$defs/Node"}
    with pytest.raises(ConfigError, match="recursive \\$ref"):
        OutputFormat("schema", node).grammar()
