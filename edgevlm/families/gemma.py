"""The Gemma family's vision models: Gemma 3 (a SigLIP image of 896 px pooled 4x4 into 256 tokens,
attended both ways), Gemma 3n and Gemma 4. Each projector pairs with its own text architecture.

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from edgevlm.families.mtmd import MtmdFamily

# clip.cpp pools Gemma 3's patches 4x4 where the GGUF does not say (hparams.n_merge = 4).
GEMMA3 = MtmdFamily("gemma3", frozenset({"gemma3"}), text_archs=frozenset({"gemma3"}), default_merge=4)
GEMMA3N = MtmdFamily("gemma3n", frozenset({"gemma3nv"}), text_archs=frozenset({"gemma3n"}))
GEMMA4 = MtmdFamily("gemma4", frozenset({"gemma4v"}), text_archs=frozenset({"gemma4"}))
