"""`python -m edgevlm`: the same as the `edgevlm` command."""

from edgevlm.cli.entry import main

main()
