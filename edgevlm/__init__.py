"""edgevlm: a 4-bit LLaVA on a home GPU or CPU, through llama.cpp."""

__version__ = "0.1.0"
