"""XMP sidecars and embedding, read back with ExifTool (a tool nobody here wrote)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.describe.xmp import XmpError, XmpFields, XmpState, read_states, sidecar_path, write

DATA = Path(__file__).resolve().parents[1] / "data"
pytestmark = pytest.mark.skipif(shutil.which("exiftool") is None,
                                reason="ExifTool is not installed (.ci/run installs libimage-exiftool-perl)")


def fields(description: str, *tags: str, settings: str = "s1") -> XmpFields:
    return XmpFields(description, tags, "edgevlm test", settings, "2026:11:30 12:00:00Z")


def exiftool_read(path: Path, *tags: str) -> dict[str, object]:
    done = subprocess.run(["exiftool", "-j", *tags, str(path)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)[0]


def test_a_new_sidecar_is_read_back_by_exiftool(tmp_path: Path) -> None:
    sidecar = sidecar_path(tmp_path / "IMG_1.jpg")
    assert sidecar.name == "IMG_1.jpg.xmp"
    assert sidecar_path(tmp_path / "IMG_1.jpg", "IMG.xmp").name == "IMG_1.xmp"
    write(sidecar, fields("A red bicycle by a wall.", "bicycle", "red"), None)
    read = exiftool_read(sidecar, "-XMP-dc:Description", "-XMP-dc:Subject")
    assert read["Description"] == "A red bicycle by a wall."
    assert read["Subject"] == ["bicycle", "red"]
    assert not list(tmp_path.glob(".*"))  # no temporary file left


def test_a_darktable_sidecar_keeps_its_history_rating_and_user_tags(tmp_path: Path) -> None:
    sidecar = tmp_path / "IMG_2.jpg.xmp"
    shutil.copy(DATA / "darktable.xmp", sidecar)
    write(sidecar, fields("First.", "dog", "park"), read_states([sidecar]).get(sidecar))
    write(sidecar, fields("Second.", "cat"), read_states([sidecar])[sidecar])  # a rerun, new tags
    read = exiftool_read(sidecar, "-XMP:all")
    assert read["Rating"] == 4 and read["Description"] == "Second."
    assert read["Subject"] == ["family", "cat"]  # the user's tag kept, edgevlm's old tags replaced
    assert read["TagsList"] == "cat"  # digiKam's list too (Immich reads its tags from it)
    history = exiftool_read(sidecar, "-struct", "-XMP-darktable:History")["History"]
    assert [step["Operation"] for step in history] == ["exposure", "colorbalancergb"]
    assert read_states([sidecar])[sidecar].settings == "s1"


def test_embedding_leaves_the_pixels_alone(tmp_path: Path) -> None:
    photo = tmp_path / "IMG_3.jpg"
    pixels = np.random.default_rng(0).integers(0, 255, (64, 96, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(photo, quality=90)
    before = np.asarray(Image.open(photo))
    write(photo, fields("Noise.", "noise"), None)
    assert np.array_equal(np.asarray(Image.open(photo)), before)
    assert exiftool_read(photo, "-XMP-dc:Subject")["Subject"] == "noise"


def test_a_writer_killed_mid_write_leaves_the_original_whole(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    photo = tmp_path / "IMG_4.jpg"
    Image.new("RGB", (32, 32), (200, 10, 10)).save(photo)
    original = photo.read_bytes()
    # An exiftool that starts writing its output, then dies by SIGKILL halfway.
    dying = tmp_path / "exiftool"
    dying.write_text('#!/bin/sh\n'
                     'for a; do [ "$prev" = "-o" ] && head -c 100 /dev/zero > "$a"; prev=$a; done\n'
                     'kill -9 $$\n')
    dying.chmod(0o755)
    monkeypatch.setenv("EDGEVLM_EXIFTOOL", str(dying))
    with pytest.raises(XmpError):
        write(photo, fields("Never written."), None)
    assert photo.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["IMG_4.jpg", "exiftool"]


def test_files_without_edgevlm_fields_read_as_empty(tmp_path: Path) -> None:
    plain = tmp_path / "plain.jpg"
    Image.new("RGB", (8, 8)).save(plain)
    assert read_states([plain, tmp_path / "missing.xmp"]) == {plain: XmpState()}
