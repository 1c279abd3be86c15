"""The InternVL family (InternVL3): an InternViT encoder whose images mtmd tiles, on general text
models (Qwen2, Qwen3, …), so its pairs are checked by width only.

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from edgevlm.families.mtmd import MtmdFamily

# mtmd tiles a large image in 448 px views and a thumbnail: a caption takes the thumbnail alone.
INTERNVL = MtmdFamily("internvl", frozenset({"internvl"}), owns_text_archs=False, caption_views=1,
                      frame_views=1)
