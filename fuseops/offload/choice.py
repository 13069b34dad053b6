"""Which whole tensors of a group to move: subset sums of a handful of storage sizes.

Storages move whole, so what a group can move is one of its subset sums, not any byte
count under its allowance. ``fullest_subset`` picks the storages whose sum fills an
allowance the most (plan.py). A group saves a handful of storages, so the sums are few; past
``MAX_SUMS`` (many storages of unrelated sizes) sums closer than a step of the largest
one to a kept sum are dropped: every sum kept is still exact (the storages make it),
and a budget loses little of its fill.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

# Distinct sums kept per group at most (see the docstring).
MAX_SUMS = 64


def _thin(sums: list[int]) -> list[int]:
    """``sums`` (ascending) cut to about ``MAX_SUMS``, the largest and smallest kept."""
    if len(sums) <= MAX_SUMS:
        return sums
    step = sums[-1] / MAX_SUMS
    kept, last = [], None
    for s in reversed(sums):
        if last is None or last - s >= step:
            kept.append(s)
            last = s
    if kept[-1] != sums[0]:
        # The smallest too (the empty set's 0: a group may always move nothing).
        kept.append(sums[0])
    return kept[::-1]


def _reachable(sizes: Sequence[int]) -> dict[int, tuple[int, int] | None]:
    """Each sum of a subset of ``sizes`` (thinned as the docstring says): the sum it
    extends and the index of the size added (``None`` for the empty set). A sum is
    reached first by the earliest sizes in ``sizes``' order."""
    parent: dict[int, tuple[int, int] | None] = {0: None}
    frontier = [0]
    for i, n in enumerate(sizes):
        if n <= 0:
            continue
        grown = [s + n for s in frontier if s + n not in parent]
        for s in grown:
            parent[s] = (s - n, i)
        if grown:
            frontier = _thin(sorted(frontier + grown))
    return parent


@functools.lru_cache(maxsize=256)
def fullest_subset(sizes: tuple[int, ...], cap: int) -> tuple[int, ...]:
    """Indices into ``sizes``, ascending, of a subset whose sum is the largest up to
    ``cap`` (of the exact sums kept: any sum ``subset_sums`` lists is filled exactly).
    Cached: a group asks the same of every step once its plan has settled."""
    parent = _reachable(sizes)
    best = max(s for s in parent if s <= cap)
    chosen = []
    while parent[best] is not None:
        best, i = parent[best]
        chosen.append(i)
    return tuple(sorted(chosen))
