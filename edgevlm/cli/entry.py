"""The `edgevlm` command's entry point: a Ctrl-C while the CLI is still being imported (the
first few hundred milliseconds) ends with one line, like one at any later moment."""

from __future__ import annotations

import sys


def main() -> None:
    """Import the CLI and run it."""
    try:
        from edgevlm.cli.app import main as run_cli
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        raise SystemExit(130) from None
    run_cli()
