"""`python -m edgevlm`: the same as the `edgevlm` command."""

from edgevlm.entry import main

main()
