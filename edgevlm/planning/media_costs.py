"""What images and video cost in tokens for a context: tiles, a task's view, a video frame,
how many photos a question can show, and the batch a view needs."""

from __future__ import annotations

from dataclasses import dataclass

from edgevlm.families import BlockCounter, family_for
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts
from edgevlm.planning.values import (
    CTX_STEP,
    DEFAULT_ANSWER_TOKENS,
    EXAMPLE_FRAME,
    EXAMPLE_PHOTO,
    MAX_UBATCH,
    MIN_CTX_FLOOR,
    MIN_TILES_PER_TURN,
    MIN_UBATCH,
    TEXT_RESERVE_TOKENS,
    VideoFrameCost,
    round_up,
)
from edgevlm.vision.layout import Detail, ImagePlan, ViewBudget, with_task
from edgevlm.vision.tiling import TurnCosts, even_share, page_room


def min_ctx_for_images(projector: ProjectorFacts, *, answer_tokens: int = DEFAULT_ANSWER_TOKENS) -> int:
    """The smallest context that holds one tiled image turn: global view, two tiles, text, answer."""
    needed = projector.tokens_per_image * (1 + MIN_TILES_PER_TURN) + TEXT_RESERVE_TOKENS + answer_tokens
    return max(MIN_CTX_FLOOR, round_up(needed, CTX_STEP))


def estimated_costs(projector: ProjectorFacts) -> TurnCosts:
    """Token costs for a model whose vocabulary is not at hand (a preset not yet downloaded).

    Measured on LLaVA-1.5's Vicuna prompt: a 40-token system prompt, about 25 tokens of turn
    text, 5 for "Whole image:" and 30 for the widest tile label.
    """
    return TurnCosts(system_tokens=40, text_tokens=25, whole_image_tokens=5, label_tokens=30,
                     view_tokens=projector.tokens_per_image)


@dataclass(frozen=True)
class TileCounts:
    """What describe will do at one context size: the most tiles, and a 4K photo's plan."""

    max_tiles: int
    max_pooled_tiles: int
    photo_grid: tuple[int, int]
    photo_pool: int
    photo_tokens: int = 0  # the 4K photo's image block, labels included
    photo_visual_tokens: int = 0  # the photo's visual tokens, and the size the model sees it at
    photo_shown: tuple[int, int] = (0, 0)


NO_TILES = TileCounts(0, 0, (0, 0), 1)  # not even the image's smallest view fits


def _budget(costs: TurnCosts, projector: ProjectorFacts, room: int, *, pool: int | None) -> ViewBudget:
    """A view budget from a turn's token costs, as the conversation makes one."""
    return ViewBudget(room=room, tile_size=projector.image_size, view_tokens=costs.view_tokens,
                      label_tokens=costs.label_tokens, whole_label_tokens=costs.whole_image_tokens, pool=pool)


def _planned(projector: ProjectorFacts, blocks: BlockCounter | None, size: tuple[int, int],
             budget: ViewBudget) -> tuple[ImagePlan, int] | None:
    """The family's plan for an image of `size` and its block's tokens (None: it cannot fit)."""
    layout = family_for(projector).layout(projector, blocks)
    try:
        plan = layout.plan(size, budget)
    except ValueError:
        return None
    return plan, layout.block_tokens(plan, budget)


def tiles_at(costs: TurnCosts, projector: ProjectorFacts, n_ctx: int, answer_tokens: int, *,
             blocks: BlockCounter | None = None, images: int = 1) -> TileCounts:
    """What the family's layout gives at this context: its most tiles (whole and pooled), and
    EXAMPLE_PHOTO's plan as one of `images` alike in one turn."""
    room, share = costs.room(n_ctx, answer_tokens), costs.share(n_ctx, answer_tokens, images)
    layout = family_for(projector).layout(projector, blocks)
    least = layout.least_tokens(_budget(costs, projector, share, pool=None))
    if least and share < costs.whole_image_tokens + least:
        return NO_TILES  # not even the global view fits
    found = _planned(projector, blocks, EXAMPLE_PHOTO, _budget(costs, projector, share, pool=None))
    if found is None:
        return NO_TILES
    photo, tokens = found
    return TileCounts(max_tiles=layout.most_tiles(_budget(costs, projector, room, pool=1)),
                      max_pooled_tiles=layout.most_tiles(_budget(costs, projector, room, pool=2)),
                      photo_grid=photo.grid, photo_pool=photo.pool, photo_tokens=tokens,
                      photo_visual_tokens=photo.visual_tokens, photo_shown=photo.shown_size)


def task_tokens_at(costs: TurnCosts, projector: ProjectorFacts, n_ctx: int, answer_tokens: int, *,
                   blocks: BlockCounter | None = None) -> tuple[tuple[str, int], ...]:
    """EXAMPLE_PHOTO's visual tokens for each task, one image a question, as describe plans them
    (the family's budget for the task within the room); 0 where the task's floor does not fit."""
    layout = family_for(projector).layout(projector, blocks)
    room = costs.room(n_ctx, answer_tokens)
    found = []
    for detail in Detail:
        budget = with_task(_budget(costs, projector, room, pool=None), detail, layout.budgets)
        try:
            plan = layout.plan(EXAMPLE_PHOTO, budget)
        except ValueError:  # the floor, or not even the smallest view, fits
            found.append((detail.value, 0))
            continue
        found.append((detail.value, plan.visual_tokens))
    return tuple(found)


def video_frame_at(costs: TurnCosts, projector: ProjectorFacts, n_ctx: int, answer_tokens: int, *,
                   blocks: BlockCounter | None = None) -> VideoFrameCost:
    """A 720p video frame as describe shows it: one of a window's blocks (a frame, or a merged
    pair where the family merges them), each an even share of half the room; fewer frames a
    window where not all fit (see fit_frames)."""
    room = page_room(costs.room(n_ctx, answer_tokens))
    layout = family_for(projector).layout(projector, blocks)
    scaffold = layout.frames
    merge = max(scaffold.merge, 1)
    # A layout with a fixed least view (LLaVA's global view) shows fewer frames where not all fit
    # (mtmd's families shrink each frame instead: a window always shows its blocks).
    least = layout.least_tokens(_budget(costs, projector, room, pool=None))
    floor = costs.whole_image_tokens + least
    frames = max(1, min(scaffold.window_frames, room // floor)) if least else scaffold.window_frames
    share = even_share(room, -(-frames // merge))
    if least and share < floor:
        return VideoFrameCost()
    budget = with_task(_budget(costs, projector, share, pool=None), Detail.VIDEO_FRAME, layout.budgets)
    found = _planned(projector, blocks, EXAMPLE_FRAME, budget)
    if found is None:
        return VideoFrameCost()
    frame = found[0]
    return VideoFrameCost(frame.visual_tokens, frame.shown_size, frames, merge, scaffold.fps,
                          read_frames=scaffold.window_frames)


def most_images_at(costs: TurnCosts, projector: ProjectorFacts, n_ctx: int, answer_tokens: int, *,
                   blocks: BlockCounter | None = None, limit: int = 64) -> int:
    """How many EXAMPLE_PHOTOs one turn can show, each at its smallest view at least (0: not one)."""
    def fits(n: int) -> bool:
        return tiles_at(costs, projector, n_ctx, answer_tokens, blocks=blocks, images=n).photo_tokens > 0

    low, high = 0, limit  # fits() only turns false as n grows: a binary search
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def ubatch_for(projector: ProjectorFacts, text: TextModelFacts | None = None) -> int:
    """n_ubatch (= n_batch) so that one image view is decoded in one ubatch, and, for a family
    whose image rows attend to each other both ways beside this text model (Gemma 3, most
    Gemma 4), its largest image: such a block must sit in one ubatch (mtmd decodes it so), so
    the planner raises the ubatch rather than refuse the image; the compute buffer it costs is
    counted with it.

    LLaVA's 576-token view would otherwise be split 512 + 64, and the small remainder runs at
    a fraction of the speed on a GPU. Measured on the CPU: 576 vs 512 is within noise (+2%),
    so the compute buffer's 12% growth buys GPUs the most.
    """
    tokens = projector.tokens_per_image
    if tokens >= MIN_UBATCH:
        one_view = tokens if tokens <= MAX_UBATCH else MIN_UBATCH
    else:
        one_view = -(-MIN_UBATCH // tokens) * tokens
    both_ways = family_for(projector).non_causal_rows(projector, text) if text is not None else 0
    return max(one_view, both_ways)
