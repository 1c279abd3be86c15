"""Downloads against a fake Hugging Face hub on 127.0.0.1: verify, resume, reject, offline."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from ..conftest import run_cli

REPO = "edgevlm/fake-llava"


class FakeHub:
    """Serves /REPO/resolve/main/FILE like the hub: HEAD with LFS headers, ranged GET."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.files = {"model.gguf": rng.bytes(3_000_000), "mmproj.gguf": rng.bytes(400_000)}
        self.advertised = {name: hashlib.sha256(data).hexdigest() for name, data in self.files.items()}
        self.drop_after: int | None = None  # cut the next GET of model.gguf after this many bytes
        self.requests: list[tuple[str, str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _file(self) -> str | None:
                prefix = f"/{REPO}/resolve/main/"
                name = self.path.split("?")[0][len(prefix):] if self.path.startswith(prefix) else ""
                return name if name in hub.files else None

            def _headers(self, name: str, length: int, status: int, extra: dict[str, str]) -> None:
                self.send_response(status)
                self.send_header("X-Repo-Commit", "a" * 40)
                self.send_header("ETag", f'"{hub.advertised[name]}"')
                self.send_header("X-Linked-Etag", f'"{hub.advertised[name]}"')
                self.send_header("X-Linked-Size", str(len(hub.files[name])))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(length))
                for key, value in extra.items():
                    self.send_header(key, value)
                self.end_headers()

            def do_HEAD(self) -> None:  # noqa: N802
                name = self._file()
                hub.requests.append(("HEAD", self.path, ""))
                if name is None:
                    self.send_error(404)
                    return
                self._headers(name, len(hub.files[name]), 200, {})

            def do_GET(self) -> None:  # noqa: N802
                name = self._file()
                hub.requests.append(("GET", self.path, self.headers.get("Range", "")))
                if name is None:
                    self.send_error(404)
                    return
                data = hub.files[name]
                start = 0
                if self.headers.get("Range", "").startswith("bytes="):
                    start = int(self.headers["Range"][6:].split("-")[0])
                body = data[start:]
                extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
                self._headers(name, len(body), 206 if start else 200, extra)
                if name == "model.gguf" and hub.drop_after is not None:
                    cut, hub.drop_after = hub.drop_after, None
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture()
def hub() -> Iterator[FakeHub]:
    fake = FakeHub()
    fake.thread.start()
    yield fake
    fake.server.shutdown()


@pytest.fixture()
def models_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "presets.local.toml").write_text(f"""
[presets.fake]
repo_id = "{REPO}"
model_file = "model.gguf"
mmproj_file = "mmproj.gguf"
approx_bytes = 3400000
""")
    return folder


def _fetch(hub: FakeHub, models_dir: Path, *args: str, offline: bool = False):  # noqa: ANN202
    env = {"HF_ENDPOINT": hub.endpoint, "EDGEVLM_MODELS_DIR": str(models_dir),
           "HF_HUB_OFFLINE": "1" if offline else "0", "HF_HUB_DISABLE_XET": "1"}
    return run_cli(*args, env=env, timeout=120)


def test_full_download_is_verified_and_listed(hub: FakeHub, models_dir: Path) -> None:
    result = _fetch(hub, models_dir, "fetch", "fake")
    assert result.returncode == 0, result.stderr
    for name, data in hub.files.items():
        assert (models_dir / "fake" / name).read_bytes() == data
    records = json.loads((models_dir / "fake" / ".verified.json").read_text())
    assert records["model.gguf"]["sha256"] == hub.advertised["model.gguf"]
    listing = _fetch(hub, models_dir, "models")
    assert "fake" in listing.stdout and "verified" in listing.stdout
    before = len(hub.requests)
    again = _fetch(hub, models_dir, "fetch", "fake")
    assert again.returncode == 0 and len(hub.requests) == before  # verified files: no network


def test_a_cut_download_resumes_where_it_stopped(hub: FakeHub, models_dir: Path) -> None:
    hub.drop_after = 1_000_000
    first = _fetch(hub, models_dir, "fetch", "fake")
    assert first.returncode == 2 and "again to resume" in first.stderr
    part = models_dir / "fake" / "model.gguf.part"
    assert part.exists() and 0 < part.stat().st_size < len(hub.files["model.gguf"])
    assert not (models_dir / "fake" / "model.gguf").exists()  # a partial file is never used
    kept = part.stat().st_size
    second = _fetch(hub, models_dir, "fetch", "fake")
    assert second.returncode == 0, second.stderr
    ranges = [r for method, path, r in hub.requests if method == "GET" and path.endswith("model.gguf")]
    assert ranges[-1] == f"bytes={kept}-"
    assert (models_dir / "fake" / "model.gguf").read_bytes() == hub.files["model.gguf"]


def test_content_that_does_not_match_its_hash_is_not_used(hub: FakeHub, models_dir: Path) -> None:
    hub.advertised["mmproj.gguf"] = "0" * 64
    result = _fetch(hub, models_dir, "fetch", "fake")
    assert result.returncode == 2 and "does not match the hub's SHA-256" in result.stderr
    assert not (models_dir / "fake" / "mmproj.gguf").exists()
    assert not (models_dir / "fake" / "mmproj.gguf.part").exists()
    assert "Traceback" not in result.stderr


def test_offline_uses_present_files_and_names_missing_ones(hub: FakeHub, models_dir: Path) -> None:
    missing = _fetch(hub, models_dir, "fetch", "fake", offline=True)
    assert missing.returncode == 2
    assert "fake: model.gguf is not downloaded and HF_HUB_OFFLINE is set" in missing.stderr
    assert "edgevlm fetch fake" in missing.stderr and not hub.requests
    assert _fetch(hub, models_dir, "fetch", "fake").returncode == 0
    count = len(hub.requests)
    present = _fetch(hub, models_dir, "fetch", "fake", offline=True)
    assert present.returncode == 0 and len(hub.requests) == count


def test_unknown_preset_and_unwritable_models_dir(hub: FakeHub, models_dir: Path, tmp_path: Path) -> None:
    unknown = _fetch(hub, models_dir, "fetch", "llava-99b")
    assert unknown.returncode == 2 and "known presets: llava-1.5-7b" in unknown.stderr
    assert "fake" in unknown.stderr  # presets from presets.local.toml are listed too
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    env_dir = blocked / "models"
    result = run_cli("fetch", "llava-1.5-7b", env={"EDGEVLM_MODELS_DIR": str(env_dir),
                                                   "HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0"})
    assert result.returncode == 2 and "cannot create" in result.stderr


def test_describe_without_the_files_suggests_fetch(models_dir: Path, tmp_path: Path) -> None:
    image = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(image)
    result = run_cli("describe", str(image), "--model", "fake", env={"EDGEVLM_MODELS_DIR": str(models_dir)})
    assert result.returncode == 2 and "edgevlm fetch fake" in result.stderr


def test_plan_answers_for_a_preset_that_is_not_downloaded(tmp_path: Path) -> None:
    result = run_cli("plan", "llava-1.5-13b", "--vram", "12GiB", "--json",
                     env={"EDGEVLM_MODELS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["n_layers"] == 41 and data["n_gpu_layers"] == 41
    assert any("planned from the catalog" in note for note in data["notes"])


def test_no_network_fails_at_once_and_leaves_nothing_behind(models_dir: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port on this machine that nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed}", "EDGEVLM_MODELS_DIR": str(models_dir),
           "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}
    result = run_cli("fetch", "fake", env=env, timeout=120)
    assert result.returncode == 2
    assert "Retrying" not in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "cannot reach" in result.stderr
    assert not (models_dir / "fake").exists()  # no empty folder left behind
