"""One step's device-to-host queue, planned whole: which storages each group moves.

The queue model (planner.py's docstring says where it comes from): group ``g``'s copies
are issued as it saves them (early.py) and each starts when its storage has been saved
(``Profile.ready``; at the group's start when unknown) or when the copies queued before
it end, whichever is later; they must end by the start of group
``g + keep_last + 1 + SETTLE_LAG`` (or the forward's end); its reload must fit in its
window of group ``g + 1``'s backward. ``copy_limit`` is the bound in bytes from the
group's start (when a group's copies may start and the most bytes they may be, given
when the link frees); ``copies_end`` times a chosen set of storages from their saves.

Storages move whole: a group moves one of its subset sums (choice.py), and a byte budget
per group, planned in order and filled by the group (what a group left of its window
went to the next, but only as a byte count) lost 20-45 % of budgets on the H100 (mlp:
64 and 256 MiB storages against budgets of 160-240 MiB). ``plan_step`` instead chooses,
over the whole step, the subset sum of every group that keeps the queue within every
deadline and window and moves the most bytes in all: a group may move less than its
window so that a later one fits a whole storage more. It walks the groups in order,
keeping every (bytes moved so far, link free) pair that no other beats on both (more
bytes, earlier free); a group's handful of sums keeps that set small. Each group's cap
is the sum chosen, so the scheduler's fullest subset under it (choice.py) moves exactly
that. ``prior`` caps every group (budgets never grow once planned for a layout, so no
pinned memory is allocated once the plan has settled): no group's cap grows in a replan.

The plan is the most this model lets move; what it leaves of what the link hides
(compute x bandwidth) is the model's: copies start only once their tensors are saved,
run at the planner's margin of the rate, the last moving group's end with the
forward, and each reload fits ``RELOAD_WINDOW`` of one backward (below about 44 GB/s
the mlp's 256 MiB storages no longer fit one: its groups move 128 MiB). Fitted to the
H100 benchmark's budgets, the mlp's per-group budgets already moved this optimum
(1024 MiB); the moe's moved 7 % less than it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from fuseops.offload.choice import MAX_SUMS, fullest_subset, subset_sums

# Groups whose copies may still run when the scheduler settles them (it waits for those
# issued SETTLE_LAG + 1 groups back): the slack that lets a group spill into the next.
SETTLE_LAG = 1
# The fractions of group g + 1's backward that group g's reload hides behind: most of it,
# or its tail when g + 1 is the first group to run its backward (planner.py's docstring).
RELOAD_WINDOW = 0.9
FIRST_RELOAD_WINDOW = 0.25


@dataclass(frozen=True)
class Profile:
    """Per group of a layout: forward seconds (start to the next group's start) and
    backward seconds (start to the previous group's start; ``None`` where unseen)."""

    layout: tuple[int, ...]
    keep_last: int
    forward: tuple[float, ...]
    backward: tuple[float | None, ...]
    steps: int
    # The first reload's window, measured in planned steps: pairs of (position of the
    # group it brings back, seconds from its start to that group's backward).
    first_reload: tuple[tuple[int, float], ...] = ()
    # Per group, the bytes of each storage it saved that may move, in save order (the
    # last step measured; ``()`` when unknown: the plan then counts bytes, not storages).
    sizes: tuple[tuple[int, ...], ...] = ()
    # Per group, aligned with ``sizes``: seconds from the group's start to each storage's
    # save (where its copy may start), measured in learning steps; ``()`` when unknown:
    # every storage is then counted ready at its group's start.
    ready: tuple[tuple[float, ...], ...] = ()

    @functools.cached_property
    def starts(self) -> tuple[float, ...]:
        """Each group's forward start in seconds, and the forward's end: summed once per
        profile, not at every group's budget and move (O(groups) each)."""
        starts = [0.0]
        for t in self.forward:
            starts.append(starts[-1] + t)
        return tuple(starts)

    @functools.cached_property
    def reload_windows(self) -> dict[int, float]:
        """``first_reload`` by position, built once per profile, not per budget."""
        return dict(self.first_reload)


def copy_limit(profile: Profile, position: int, keep_last: int, link_free: float, rate: float) -> tuple[float, int]:
    """When group ``position``'s copies start, and the most bytes they may be at ``rate``
    bytes per second, the link free from ``link_free`` (seconds, the profile's): from the
    group's own start (its copies are issued as it saves them, early.py) to the start of
    group ``position + keep_last + 1 + SETTLE_LAG``, where they are settled."""
    n = len(profile.layout)
    starts = profile.starts
    start = max(starts[position], link_free)
    window = max(0.0, starts[min(position + keep_last + 1 + SETTLE_LAG, n)] - start)
    backward = profile.backward[position + 1] if position + 1 < n else None
    measured = profile.reload_windows.get(position)
    if measured is not None:
        window = min(window, RELOAD_WINDOW * measured)
    elif backward is not None:
        first = position + 1 >= n - max(keep_last, 1)
        window = min(window, (FIRST_RELOAD_WINDOW if first else RELOAD_WINDOW) * backward)
    return start, int(window * rate)


def _save_order_fill(sizes: tuple[int, ...], cap: int) -> int:
    return sum(sizes[i] for i in _save_order_subset(sizes, cap))


def _save_order_subset(sizes: tuple[int, ...], cap: int) -> list[int]:
    chosen, moved = [], 0
    for i, n in enumerate(sizes):
        if n <= cap - moved:
            chosen.append(i)
            moved += n
    return chosen


def copies_end(profile: Profile, position: int, indices, link_free: float, rate: float) -> float:
    """When the copies of group ``position``'s storages ``indices`` (save order) end: each
    is issued as it is saved (``Profile.ready``) and queues on the link behind the ones
    before it."""
    start = profile.starts[position]
    ready = profile.ready[position]
    sizes = profile.sizes[position]
    end = link_free
    for i in indices:
        end = max(end, start + ready[i]) + sizes[i] / rate
    return end


def _options(sizes: tuple[int, ...], keep_last: int) -> list[tuple[int, int]]:
    """(cap, bytes moved under it) of a group, ascending in both. With ``keep_last >= 1``
    the group's storages are all known when it moves, and the scheduler moves the
    fullest subset under its cap: every subset sum. With ``keep_last=0`` each storage
    is decided as it is saved, in save order, while it fits what the cap has left."""
    sums = subset_sums(sizes, sum(sizes))
    if keep_last > 0:
        return [(s, s) for s in sums]
    options, best = [], -1
    for cap in sums:
        moved = _save_order_fill(sizes, cap)
        if moved > best:
            options.append((cap, moved))
            best = moved
    return options


@dataclass(frozen=True)
class StepPlan:
    """Per group position that moves: its cap, the bytes it moves under it, and the
    bytes the groups before it move (a step whose earlier groups moved more than that
    has a later queue than planned)."""

    caps: tuple[int, ...]
    moves: tuple[int, ...]
    before: tuple[int, ...]


def _frontier(points: list[tuple[int, float, tuple | None]]) -> list[tuple[int, float, tuple | None]]:
    """The points no other beats on both more bytes and an earlier link, most bytes
    first; past ``MAX_SUMS`` of them, evenly thinned (the most bytes kept)."""
    points.sort(key=lambda p: (-p[0], p[1]))
    kept, free = [], math.inf
    for point in points:
        if point[1] < free:
            kept.append(point)
            free = point[1]
    if len(kept) > MAX_SUMS:
        kept = kept[:: math.ceil(len(kept) / MAX_SUMS)]
    return kept


def plan_step(profile: Profile, keep_last: int, rate: float, prior: dict[int, int]) -> StepPlan:
    """The caps of the step's moving groups (all but the last ``keep_last``) that move the
    most bytes in all at ``rate``, each at most its ``prior`` (see the docstring)."""
    n = len(profile.layout)
    known = len(profile.sizes) == n
    timed = known and len(profile.ready) == n
    # (bytes moved so far, when the link frees, the chain of (cap, moves) chosen).
    points: list[tuple[int, float, tuple | None]] = [(0, 0.0, None)]
    for position in range(n - keep_last):
        sizes = profile.sizes[position] if known else ()
        options = _options(sizes, keep_last) if known else None
        # Saves timed: an option's copies end when its storages' queue does (each from
        # its save), which must be by the deadline (``copy_limit``'s start is the group's).
        timed_here = timed and len(profile.ready[position]) == len(sizes)
        deadline = profile.starts[min(position + keep_last + 1 + SETTLE_LAG, n)]
        cap_before = prior.get(position)
        grown = []
        for total, free, chain in points:
            start, limit = copy_limit(profile, position, keep_last, free, rate)
            if cap_before is not None:
                limit = min(limit, cap_before)
            # Sizes unknown: the bytes the window holds, as if storages could be cut.
            for cap, moves in options if options is not None else ((limit, limit),):
                if cap > limit:
                    break
                end = start + moves / rate
                if timed_here and moves > 0:
                    moving = _save_order_subset(sizes, cap) if keep_last == 0 else fullest_subset(sizes, cap)
                    end = copies_end(profile, position, moving, free, rate)
                    if end > deadline:
                        # A larger sum of storages saved earlier may still fit.
                        continue
                grown.append((total + moves, end if moves > 0 else free, (cap, moves, chain)))
        points = _frontier(grown)
    chain = points[0][2]
    chosen = []
    while chain is not None:
        cap, moves, chain = chain
        chosen.append((cap, moves))
    chosen.reverse()
    before, total = [], 0
    for _, moves in chosen:
        before.append(total)
        total += moves
    return StepPlan(tuple(c for c, _ in chosen), tuple(m for _, m in chosen), tuple(before))
