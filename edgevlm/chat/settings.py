"""A conversation's settings: one frozen value, checked where it is made, and the partial value a
turn's overrides come as (an API request's fields, a REPL command, describe's options).

The faces translate their flags and fields into these; the conversation holds one ChatSettings
and changes it only through `Conversation.configure`, on the thread that owns it, after the
layout has checked it (pool and tiles mean nothing to a family whose images mtmd lays out, and
were silently ignored there, issue 50.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Literal, TypeVar, Union

from edgevlm.errors import ConfigError
from edgevlm.values.sampling import Sampling
from edgevlm.vision.layout import Detail, ImageLayout, check_view_settings
from edgevlm.vision.tiling import POOL_CHOICES

CAPTION_TOKENS = 120  # the most tokens an image's summary takes (about two sentences of detail)


class SummaryMode(str, Enum):
    """What an answered image is swapped for."""

    CAPTION = "caption"  # a caption made for it in idle time
    ANSWER = "answer"  # the answer itself (describe's transcripts, a document's pages)
    NONE = "none"  # nothing: describe rewinds to the system prompt after each image


class Keep(Enum):
    """A field of a SettingsChange that leaves its setting as it is."""

    KEEP = "keep"


KEEP = Keep.KEEP
T = TypeVar("T")
Changed = Union[T, Literal[Keep.KEEP]]  # noqa: UP007 - a new value, or KEEP (a generic alias)


@dataclass(frozen=True)
class ChatSettings:
    """How a conversation answers and what it keeps."""

    max_tokens: int = 512
    sampling: Sampling = field(default_factory=Sampling)
    max_tiles: int | None = None  # None: as many as fit; 0: the global view only
    pool: int | None = 1  # 1, 2, or None for auto (pooled tiles only when they buy a larger grid)
    summary: SummaryMode = SummaryMode.CAPTION
    keep_images: int = 0  # answered images kept live, newest first, before they are summarised
    system: str | None = None
    detail: Detail = Detail.CHAT  # what images are shown for: each family's budget for that task
    frame_tokens: int | None = None  # the most visual tokens a video frame takes (None: its family's)
    stop: tuple[str, ...] = ()  # the answer ends before the first of these
    caption_tokens: int = CAPTION_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", _enum(SummaryMode, self.summary, "summary"))
        object.__setattr__(self, "detail", _enum(Detail, self.detail, "detail"))
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, not {self.max_tokens}",
                              settings=("max_tokens",))
        if self.max_tiles is not None and self.max_tiles < 0:
            raise ConfigError(f"tiles must be auto or 0 or more, not {self.max_tiles}", settings=("tiles",))
        if self.pool is not None and self.pool not in POOL_CHOICES:
            choices = ", ".join(map(str, POOL_CHOICES))
            raise ConfigError(f"pool must be auto or {choices}, not {self.pool}", settings=("pool",))
        if self.keep_images < 0:
            raise ConfigError(f"keep_images must be 0 or more, not {self.keep_images}",
                              settings=("keep_images",))
        if self.frame_tokens is not None and self.frame_tokens < 1:
            raise ConfigError(f"frame_tokens must be at least 1, not {self.frame_tokens}",
                              settings=("frame_tokens",))
        if self.caption_tokens < 1:
            raise ConfigError(f"caption_tokens must be at least 1, not {self.caption_tokens}",
                              settings=("caption_tokens",))

    def merged(self, change: SettingsChange) -> ChatSettings:
        """These settings with a turn's overrides (each field left KEEP stays), checked again."""
        new = {f.name: getattr(change, f.name) for f in fields(change)}
        return replace(self, **{name: value for name, value in new.items() if value is not KEEP})

    def checked_for(self, layout: ImageLayout) -> ChatSettings:
        """The settings, if the layout can honour them (ConfigError naming pool or tiles if not)."""
        check_view_settings(layout, pool=self.pool, max_tiles=self.max_tiles)
        return self


@dataclass(frozen=True)
class SettingsChange:
    """A turn's overrides of a conversation's settings: a field left KEEP is not changed."""

    max_tokens: Changed[int] = KEEP
    sampling: Changed[Sampling] = KEEP
    max_tiles: Changed[int | None] = KEEP
    pool: Changed[int | None] = KEEP
    system: Changed[str | None] = KEEP
    detail: Changed[Detail] = KEEP
    frame_tokens: Changed[int | None] = KEEP
    stop: Changed[tuple[str, ...]] = KEEP

    def value_or(self, name: str, default: object) -> object:
        """The change's value for a field, or `default` where it leaves the setting."""
        value = getattr(self, name)
        return default if value is KEEP else value


E = TypeVar("E", bound=Enum)


def _enum(kind: type[E], value: object, name: str) -> E:
    """A setting's value as its enum (a face may hand the plain string)."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(member.value) for member in kind)
        raise ConfigError(f"{name} must be one of {choices}, not {value!r}", settings=(name,)) from None
