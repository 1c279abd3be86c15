"""edgevlm: vision-language models on a home GPU or CPU, through llama.cpp."""

__version__ = "0.1.0"
