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
# A thumbnail past a quarter of a 1,024-token photo is no longer small: the tier is for keeping
# many images at a few dozen tokens each.
MAX_THUMBNAIL_TOKENS = 256
# Each image shown again costs its whole prefill: four is already a long turn.
MAX_LOOK_MATCHES = 4


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


# Tasks a merge leaves alone unless it names them: merged rows blur small print and edges.
READING = frozenset({Detail.OCR, Detail.GROUNDING})
MERGED_BY_DEFAULT = frozenset(Detail) - READING


@dataclass(frozen=True)
class Merge:
    """--merge R[:TASK,...]: each image's visual tokens merged down to a share R of them after
    the projector (values/merging.py), for the tasks named (by default every task but reading
    text and finding objects)."""

    share: float
    tasks: frozenset[Detail] = MERGED_BY_DEFAULT

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ConfigError(f"merge must be a share of the tokens between 0 and 1 (0.25: a quarter), "
                              f"not {self.share:g}", settings=("merge",))
        object.__setattr__(self, "tasks", frozenset(_enum(Detail, t, "merge's task") for t in self.tasks))
        if not self.tasks:
            raise ConfigError("merge names no task", settings=("merge",))

    @classmethod
    def parse(cls, text: str | None) -> Merge | None:
        """`0.25`, `0.25:chat,ocr`, or `off` or no flag at all (None); ConfigError naming what is wrong."""
        if text is None:
            return None
        share, _, tasks = text.strip().partition(":")
        if share.lower() in ("off", "none", "1", "1.0"):
            return None
        try:
            value = float(share)
        except ValueError:
            raise ConfigError(f"merge must be a share such as 0.25 (optionally :TASK,... ), or off, "
                              f"not {text!r}", settings=("merge",)) from None
        named = [_enum(Detail, t.strip(), "merge's task") for t in tasks.split(",") if t.strip()]
        return cls(value, frozenset(named)) if named else cls(value)

    def __str__(self) -> str:
        if self.tasks == MERGED_BY_DEFAULT:
            return f"{self.share:g}"
        return f"{self.share:g}:" + ",".join(sorted(t.value for t in self.tasks))


@dataclass(frozen=True)
class ChatSettings:
    """How a conversation answers and what it keeps."""

    max_tokens: int = 512
    sampling: Sampling = field(default_factory=Sampling)
    max_tiles: int | None = None  # None: as many as fit; 0: the global view only
    pool: int | None = 1  # 1, 2, or None for auto (pooled tiles only when they buy a larger grid)
    summary: SummaryMode = SummaryMode.CAPTION
    keep_images: int = 0  # answered images kept live, newest first, before they are summarised
    # the most visual tokens an answered image keeps beside its summary, merged (0: the summary alone)
    keep_thumbnails: int = 0
    system: str | None = None
    detail: Detail = Detail.CHAT  # what images are shown for: each family's budget for that task
    frame_tokens: int | None = None  # the most visual tokens a video frame takes (None: its family's)
    stop: tuple[str, ...] = ()  # the answer ends before the first of these
    caption_tokens: int = CAPTION_TOKENS
    merge: Merge | None = None  # visual tokens merged after the projector, for the tasks it names
    # earlier images shown again unnamed, where their summaries match a question (0: named ones only)
    look_matches: int = 0

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
        if not 0 <= self.keep_thumbnails <= MAX_THUMBNAIL_TOKENS:
            raise ConfigError(f"keep_thumbnails must be from 0 (off) to {MAX_THUMBNAIL_TOKENS} tokens, not "
                              f"{self.keep_thumbnails}", settings=("keep_thumbnails",))
        if not 0 <= self.look_matches <= MAX_LOOK_MATCHES:
            raise ConfigError(f"look_matches must be from 0 (off) to {MAX_LOOK_MATCHES}, "
                              f"not {self.look_matches}", settings=("look_matches",))
        if self.frame_tokens is not None and self.frame_tokens < 1:
            raise ConfigError(f"frame_tokens must be at least 1, not {self.frame_tokens}",
                              settings=("frame_tokens",))
        if self.caption_tokens < 1:
            raise ConfigError(f"caption_tokens must be at least 1, not {self.caption_tokens}",
                              settings=("caption_tokens",))
        if self.merge is not None and self.detail in READING and self.detail not in self.merge.tasks:
            raise ConfigError(f"merge {self.merge} is off for {self.detail.value}: merged tokens blur small "
                              f"print and edges; name the task to merge anyway (merge "
                              f"{self.merge.share:g}:{self.detail.value}), or drop merge",
                              settings=("merge", "detail"))

    @property
    def merge_share(self) -> float | None:
        """The share of visual tokens kept for the task now (None: not merged)."""
        return self.merge.share if self.merge is not None and self.detail in self.merge.tasks else None

    def merged(self, change: SettingsChange) -> ChatSettings:
        """These settings with a turn's overrides (each field left KEEP stays), checked again. A
        conversation's merge does not follow a turn to a reading task it does not name (a
        server's --merge and a request for OCR): only a merge asked for with it is refused."""
        new = {f.name: getattr(change, f.name) for f in fields(change)}
        changed = {name: value for name, value in new.items() if value is not KEEP}
        detail = changed.get("detail", self.detail)
        if (change.merge is KEEP and self.merge is not None and detail in READING
                and detail not in self.merge.tasks):
            changed["merge"] = None
        return replace(self, **changed)

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
    merge: Changed[Merge | None] = KEEP
    look_matches: Changed[int] = KEEP

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
