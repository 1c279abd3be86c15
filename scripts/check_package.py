"""`make lint`'s packaging check: the wheel builds without a setuptools warning (`make setup`
stays quiet) and carries its data files (the chat page, ExifTool's config).

Run from the repository root: python scripts/check_package.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA_FILES = ("edgevlm/server/static/index.html", "edgevlm/describe/exiftool.config")


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                                 "--disable-pip-version-check", "-w", folder, str(ROOT)],
                                capture_output=True, text=True, timeout=300)
        said = result.stdout + result.stderr
        if result.returncode != 0 or "Warning" in said:
            print(f"check_package: the wheel does not build quietly:\n{said}", file=sys.stderr)
            return 1
        wheel = next(Path(folder).glob("edgevlm-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            missing = [name for name in DATA_FILES if name not in archive.namelist()]
    if missing:
        print(f"check_package: the wheel lacks {', '.join(missing)} (pyproject's package-data)",
              file=sys.stderr)
        return 1
    print(f"check_package: {wheel.name} builds quietly with its data files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
