"""Parity with each family's reference implementation, transformers: what a model is shown
(the size its processor resizes an image to, its grid, its visual tokens) checked against what
transformers shows it.

The reference runs in a venv of its own (torch CPU and transformers: `make parity-env`), never in
edgevlm's: `reference.py` is run there as a program that reads a request and writes an answer as
JSON, and `client.py` asks it from edgevlm's side. Only `reference.py` imports transformers.
"""
