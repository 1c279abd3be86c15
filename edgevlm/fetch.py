"""Download a preset's files from the Hugging Face hub into models/<preset>/."""

from __future__ import annotations

from pathlib import Path

from .catalog import Preset, preset_dir
from .errors import ModelError


def fetch_preset(preset: Preset) -> list[Path]:
    """Download (or find already present) the model and projector of a preset."""
    if preset.repo_id is None:
        raise ModelError(f"'{preset.name}' is generated locally, not downloaded: run `make test-models`")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    folder = preset_dir(preset)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for filename in (preset.model_file, preset.mmproj_file):
        try:
            local = hf_hub_download(preset.repo_id, filename, revision=preset.revision,
                                    local_dir=folder)
        except LocalEntryNotFoundError as exc:
            raise ModelError(f"cannot download {preset.repo_id}/{filename}: offline or hub "
                             f"unreachable ({exc.__class__.__name__})") from None
        except (HfHubHTTPError, OSError) as exc:
            raise ModelError(f"download of {preset.repo_id}/{filename} failed: {exc}") from None
        paths.append(Path(local))
    return paths
