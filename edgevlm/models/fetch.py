"""Download a preset's files from the Hugging Face hub: resumable, verified, offline-friendly.

huggingface_hub resolves the file (HF_ENDPOINT, HF_TOKEN, revisions, redirects) and gives its
LFS SHA-256 (X-Linked-Etag) and size; the bytes go to `<file>.part` with ranged requests, so
a download cut off halfway continues where it stopped, even in a later run (huggingface_hub
2.x deletes its own partial files). A file is only renamed into place once its SHA-256
matches the hub's, and that check is remembered in `.verified.json` beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from edgevlm.errors import ModelError, one_line
from edgevlm.models.catalog import Preset, preset_dir
from edgevlm.store.files import write_atomically

VERIFIED_FILE = ".verified.json"
CHUNK_BYTES = 1 << 20
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
ProgressFn = Callable[[str, int, int | None], None]  # (filename, bytes done, total)


def offline() -> bool:
    """HF_HUB_OFFLINE=1: use what is here, never touch the network."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch_preset(preset: Preset, *, on_progress: ProgressFn | None = None) -> list[Path]:
    """Make sure both files of a preset are present and verified; download what is missing."""
    if preset.repo_id is None:
        raise ModelError(f"'{preset.name}' is generated locally, not downloaded: run `make test-models`")
    folder = preset_dir(preset)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create {folder}: {exc.strerror or exc}") from None
    try:
        return [fetch_file(preset, name, folder / name, on_progress=on_progress)
                for name in (preset.model_file, preset.mmproj_file)]
    except BaseException:
        if created and not any(folder.iterdir()):
            folder.rmdir()  # a failed first fetch leaves nothing behind
        raise


def is_verified(path: Path) -> bool:
    """Whether this exact file (size and mtime) was checked against the hub's hash."""
    record = _records(path.parent).get(path.name)
    if not record or not path.exists():
        return False
    stat = path.stat()
    return record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns


def preset_state(preset: Preset) -> tuple[str, Path]:
    """A preset's files: missing, present (generated locally), verified or unverified; and where."""
    folder = preset_dir(preset)
    files = [folder / preset.model_file, folder / preset.mmproj_file]
    if not all(f.exists() for f in files):
        return "missing", folder
    if preset.repo_id is None:
        return "present", folder
    return ("verified" if all(is_verified(f) for f in files) else "unverified"), folder


def fetch_file(preset: Preset, filename: str, dest: Path, *, on_progress: ProgressFn | None = None) -> Path:
    """One file: verified already, or downloaded (resuming `.part`) and verified now."""
    if is_verified(dest):
        return dest
    if offline():
        if dest.exists():
            return dest  # present but never verified: usable offline, checked on the next fetch
        raise ModelError(f"{preset.name}: {filename} is not downloaded and HF_HUB_OFFLINE is set; "
                         f"run `edgevlm fetch {preset.name}` with network access")
    expected_sha, size, url = _metadata(preset, filename)
    if dest.exists():
        if size is not None and dest.stat().st_size == size and _sha256_file(dest) == expected_sha:
            _remember(dest, expected_sha)
            return dest
        dest.unlink()  # a different or damaged file: fetch it again
    part = dest.with_name(dest.name + ".part")
    digest = _download(url, part, size, filename, on_progress)
    if size is not None and part.stat().st_size != size:
        raise ModelError(f"{preset.name}: {filename} stopped at {part.stat().st_size:,} of {size:,} bytes; "
                         f"run `edgevlm fetch {preset.name}` again to resume")
    if expected_sha and digest != expected_sha:
        part.unlink(missing_ok=True)
        raise ModelError(f"{preset.name}: {filename} does not match the hub's SHA-256 "
                         f"({digest[:12]}… instead of {expected_sha[:12]}…); it was deleted, "
                         f"run `edgevlm fetch {preset.name}` again")
    part.replace(dest)
    _remember(dest, digest)
    return dest


def _metadata(preset: Preset, filename: str) -> tuple[str, int | None, str]:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(preset.repo_id or "", filename, revision=preset.revision)
    try:
        # No retries: without a network they only add seconds of "Retrying in Ns" before the error.
        meta = get_hf_file_metadata(url, retry_on_errors=False)
    except Exception as exc:  # network, 404, auth: each is one line for the user
        raise ModelError(f"{preset.name}: cannot reach {filename} on the hub ({one_line(exc)}); "
                         "check the network, HF_ENDPOINT or HF_TOKEN") from None
    sha = (meta.etag or "").strip('"').lower()
    return (sha if _SHA256.match(sha) else ""), meta.size, meta.location or url


def _download(url: str, part: Path, size: int | None, filename: str,
              on_progress: ProgressFn | None) -> str:
    from huggingface_hub.utils import build_hf_headers, get_session

    digest = hashlib.sha256()
    offset = part.stat().st_size if part.exists() else 0
    if size is not None and offset > size:
        part.unlink()
        offset = 0
    if offset:
        with part.open("rb") as handle:  # the hash must cover what an earlier run wrote
            for block in iter(lambda: handle.read(CHUNK_BYTES), b""):
                digest.update(block)
    if size is not None and offset == size:
        return digest.hexdigest()
    headers = build_hf_headers()
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                  timeout=60) as response:
            if response.status_code == 200 and offset:  # the server ignored the range: start over
                offset, digest = 0, hashlib.sha256()
                part.unlink()
            elif response.status_code not in (200, 206):
                raise ModelError(f"{filename}: the hub answered HTTP {response.status_code}")
            with part.open("ab") as handle:
                done = offset
                for chunk in response.iter_bytes():  # as it arrives: a cut keeps every byte so far
                    handle.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if on_progress is not None:
                        on_progress(filename, done, size)
    except ModelError:
        raise
    except OSError as exc:
        raise ModelError(f"cannot write {part}: {exc.strerror or exc}") from None
    except Exception as exc:  # a dropped connection: what arrived stays in .part for next time
        raise ModelError(f"download of {filename} was interrupted ({one_line(exc)}); "
                         "run the same command again to resume") from None
    return digest.hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def _records(folder: Path) -> dict[str, dict[str, object]]:
    try:
        data = json.loads((folder / VERIFIED_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(path: Path, sha256: str) -> None:
    records = _records(path.parent)
    stat = path.stat()
    records[path.name] = {"sha256": sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        write_atomically(path.parent / VERIFIED_FILE, json.dumps(records, indent=1), durable=False)
    except OSError:
        pass  # only costs a re-check next time

