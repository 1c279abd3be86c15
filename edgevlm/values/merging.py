"""Fewer visual tokens after the projector: similar neighbouring rows merged into one.

The method is token merging's bipartite soft matching (Bolya et al., "Token Merging: Your ViT
But Faster", ICLR 2023, section 3), moved from inside the vision tower to its output, where
llama.cpp lets edgevlm change rows without touching the graph: each round splits the rows, in
the family's own order, into alternating sets A (even) and B (odd); every row of A is matched to
the more similar (cosine) of its two neighbours, which are both in B; the r best-matched rows of
A are averaged into their match, weighted by how many rows each already stands for (ToMe's size
weighting), and the match keeps its place. Rounds of at most a quarter of the rows repeat until
`keep` rows are left (a share of 0.25 is five rounds).

Two choices differ from ToMe, both for what an LLM reads after the projector:
- matches are restricted to neighbours in the row order (a row and the next, in a grid's raster
  order the pixels beside it), so a merged row stays where the pixels it stands for were; ToMe
  matches A with all of B, which in a 1,000-row image can merge a patch of sky into one 30 rows
  away and move what it means;
- the attention's log-size bias ToMe adds ("proportional attention") is not applied: llama.cpp's
  text model has no hook for it. A merged row is a plain mean.

Every kept row is one of the input rows' places (the kept indices are a subset, in order), so
the positions the family's layout gave those rows stay theirs. Deterministic: ties go to the
left neighbour, and the ranking is a stable sort. Pure numpy.
"""

from __future__ import annotations

import math

import numpy as np

# Each round merges at most a quarter of the rows left (ToMe merges a few per layer, over many
# layers): with half, every row of A would go each round, and which rows are kept would not
# depend on the image at all (64 rows to 16 was always the same raster of odd places). A
# quarter takes 5 rounds to 0.25 and lets similarity choose.
ROUND_SHARE = 4


def merged_count(n_rows: int, share: float) -> int:
    """How many of n_rows a merge to `share` keeps: the share rounded down, at least one row."""
    return max(1, math.floor(n_rows * share + 1e-9))


def merge_rows(rows: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """(the indices of the rows kept, ascending; the merged rows, float32), down to `keep` rows.

    Each merged row is the mean of the input rows it stands for, so the rows' sum, weighted by
    how many each stands for, is the input's sum."""
    n_rows = rows.shape[0]
    index = np.arange(n_rows)
    if keep >= n_rows:
        return index, rows
    if keep < 1:
        raise ValueError(f"a merge keeps at least one row, not {keep}")
    totals = rows.astype(np.float32, copy=True)  # each row's sum of the input rows it stands for
    sizes = np.ones(n_rows, dtype=np.float32)
    unit = _unit(totals)  # only rows that take a merge change: only theirs is computed again
    while index.size > keep:
        targets, scores = _best_neighbours(unit, index)
        count = min(index.size - keep, max(1, index.size // ROUND_SHARE))
        ranked = np.argsort(-scores, kind="stable")[:count]  # the A rows merged this round
        merged_from, merged_into = index[2 * ranked], index[targets[ranked]]
        np.add.at(totals, merged_into, totals[merged_from])
        np.add.at(sizes, merged_into, sizes[merged_from])
        changed = np.unique(merged_into)
        unit[changed] = _unit(totals[changed])
        index = np.delete(index, 2 * ranked)
    return index, totals[index] / sizes[index, None]


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def _best_neighbours(unit: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row of A (the even places of `index`), the place of its more similar neighbour
    (both odd: in B) and that cosine; a row with one neighbour takes it, ties the left one."""
    places = np.arange(0, index.size, 2)
    left, right = places - 1, places + 1
    similar_left = np.full(places.size, -np.inf, dtype=np.float32)
    similar_right = np.full(places.size, -np.inf, dtype=np.float32)
    has_left, has_right = left >= 0, right < index.size
    a_rows = unit[index[places]]
    similar_left[has_left] = np.einsum("ij,ij->i", a_rows[has_left], unit[index[left[has_left]]])
    similar_right[has_right] = np.einsum("ij,ij->i", a_rows[has_right], unit[index[right[has_right]]])
    targets = np.where(similar_right > similar_left, right, left)
    return targets, np.maximum(similar_left, similar_right)  # two rows or more: each has one
