"""The one place conversations and describers are made, from settings and a loaded model.

The faces translate their flags into a ChatSettings (chat/settings.py); this module hands the conversation its
sequence, prompt format, image layout and caches. Everything a face builds on (the REPL, the
server's slots, describe, the bench) starts here, so a new conversation setting is added once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from edgevlm.chat.conversation import ChatSequence, Conversation
from edgevlm.chat.prompts import PromptFormat
from edgevlm.chat.settings import ChatSettings, SummaryMode
from edgevlm.chat.structured import TEXT, OutputFormat
from edgevlm.describe.describer import Describer
from edgevlm.runtime.loading import Loaded
from edgevlm.store.caches import CacheView, EmbeddingCache
from edgevlm.store.prefix_cache import PrefixCache
from edgevlm.vision.boxes import Grounding
from edgevlm.vision.layout import ImageLayout

Encoder = EmbeddingCache | CacheView | None  # projector rows through a cache (None: CLIP each time)


@dataclass(frozen=True)
class ModelSide:
    """What a conversation needs of the model: its prompt format and how it lays out images."""

    fmt: PromptFormat
    tile_size: int
    layout: ImageLayout | None = None

    @classmethod
    def of(cls, loaded: Loaded) -> ModelSide:
        """The loaded pair's format, view size and layout."""
        return cls(loaded.prompt_format, loaded.projector_facts.image_size, loaded.layout)


def open_conversation(sequence: ChatSequence, model: ModelSide, settings: ChatSettings, *,
                      encoder: Encoder = None, prefix_cache: PrefixCache | None = None) -> Conversation:
    """A conversation on this sequence (its system prompt decoded now)."""
    return Conversation(sequence, model.fmt, tile_size=model.tile_size, settings=settings,
                        layout=model.layout,
                        encoder=encoder, prefix_cache=prefix_cache)


def conversation_for(loaded: Loaded, settings: ChatSettings, *, cache: bool = False) -> Conversation:
    """A conversation on the loaded engine's first sequence, with its caches when cache is on."""
    return open_conversation(loaded.engine.sequence(), ModelSide.of(loaded), settings,
                             encoder=loaded.image_cache() if cache else None,
                             prefix_cache=loaded.prefix_cache() if cache else None)


def slot_conversations(loaded: Loaded, settings: ChatSettings, *, cache: bool) -> list[Conversation]:
    """One conversation per sequence of the engine (the server's slots, describe --parallel),
    each with its own view of the projector-row cache and one shared prefix cache."""
    prefixes = loaded.prefix_cache() if cache else None
    model = ModelSide.of(loaded)
    return [open_conversation(sequence, model, settings, encoder=encoder, prefix_cache=prefixes)
            for sequence, encoder in _sequences(loaded, cache=cache)]


def new_describer(sequence: ChatSequence, model: ModelSide, settings: ChatSettings, *,
                  output: OutputFormat = TEXT, n_gpu_layers: int = 0, encoder: Encoder = None,
                  prefix_cache: PrefixCache | None = None, grounding: Grounding | None = None) -> Describer:
    """A describer on this sequence: single turns from the cached system prompt, no summaries
    (the describer sets the answer's grammar and token budget from its output format)."""
    started = time.perf_counter()
    conversation = open_conversation(sequence, model, replace(settings, summary=SummaryMode.NONE),
                                     encoder=encoder,
                                     prefix_cache=prefix_cache)
    # The system prompt is decoded now, before any request's clock starts: the first image is
    # charged for it (prefill and TTFT alike), so its figures add up.
    return Describer(conversation, output=output, max_tokens=settings.max_tokens, n_gpu_layers=n_gpu_layers,
                     system_prefill_s=time.perf_counter() - started, grounding=grounding)


def describers_for(loaded: Loaded, settings: ChatSettings, *, cache: bool = False,
                   output: OutputFormat = TEXT, find: bool = False) -> list[Describer]:
    """One describer per sequence of the loaded engine (one without --parallel).

    With cache, projector rows and image prefixes are kept (RAM and disk), so an image seen
    before skips CLIP, and its prefill too where restoring its KV is faster. With find, each
    answer's boxes are put on the photo, as the model's family writes them.
    """
    prefixes = loaded.prefix_cache() if cache else None
    model = ModelSide.of(loaded)
    grounding = loaded.grounding if find else None
    return [new_describer(sequence, model, settings, output=output, n_gpu_layers=loaded.n_gpu_layers,
                          encoder=encoder, prefix_cache=prefixes, grounding=grounding)
            for sequence, encoder in _sequences(loaded, cache=cache)]


def _sequences(loaded: Loaded, *, cache: bool) -> list[tuple[ChatSequence, Encoder]]:
    """Each sequence of the engine with its view of the projector-row cache."""
    return list(zip(loaded.engine.sequences(), loaded.encoders(cache=cache), strict=True))
