"""The LFM2-VL family: a SigLIP2 NaFlex encoder on LFM2's hybrid text model (short convolutions
and attention: a recurrent state, so the chat goes back through checkpoints; see models/memory.py).

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from edgevlm.families.mtmd import MtmdFamily

# clip.cpp reserves LFM2's vision graph for 16x16 merged tokens (its 256-token limit).
LFM2_VL = MtmdFamily("lfm2-vl", frozenset({"lfm2"}), text_archs=frozenset({"lfm2", "lfm2moe"}),
                     warmup_tokens_per_side=16)
