"""`python -m edgevlm.cli`: the same as the `edgevlm` command."""

from edgevlm.entry import main

main()
