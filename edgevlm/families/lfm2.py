"""The LFM2-VL family: a SigLIP2 NaFlex encoder on LFM2's hybrid text model (short convolutions
and attention: a recurrent state, so the chat goes back through checkpoints; see models/memory_kinds.py).

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from edgevlm.families.mtmd import MtmdFamily

# clip.cpp reserves LFM2's vision graph for 16x16 merged tokens (its 256-token limit).
# LFM2-VL's images take 64 to 256 tokens a view (its processor's min/max image tokens), and a
# large one is tiled (on the test pair a 4:3 photo jumps from 234 tokens to 1,779): a caption or a
# frame takes the fewest; reading has no floor of its own (the largest that fits is its best).
LFM2_VL = MtmdFamily("lfm2-vl", frozenset({"lfm2"}), text_archs=frozenset({"lfm2", "lfm2moe"}),
                     warmup_tokens_per_side=16, caption_tokens=64, frame_tokens=64)
