"""Llama 4's vision: its projector pairs only with the llama4 text architecture.

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from edgevlm.families.mtmd import MtmdFamily

LLAMA4 = MtmdFamily("llama4", frozenset({"llama4"}), text_archs=frozenset({"llama4"}))
