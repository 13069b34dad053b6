"""Early copies: with ``"auto"`` and a known layout, a group moves as it saves.

With ``keep_last=k`` the scheduler cannot tell, while a group runs, whether it will be
among the step's last ``k``, so without more knowledge group ``g``'s copies wait for
group ``g + k`` to start. Once the planner has a profile, it knows the step's layout
(the group count, and each group's eligible bytes and storage sizes): a group at a
position ``g < n - k``, in a step whose groups so far match the profile's, is not
among the last ``k`` unless the step departs from the profile. Such a group is planned
as it starts and decides each storage as it is saved (as with ``keep_last=0``): the
link works through the group's own forward instead of idling until ``g + k`` starts
(on the H100 moe stack, group 0's forward was 2.15 ms of unused link).

Which storages: the step's plan chose a sum of the profile's storage sizes for the
group (queue_plan.py); ``fullest_subset`` of those sizes names them by save index
(``Picks``), and the scheduler moves the storage saved at such an index when its size
is the profile's: exactly the planned sum, as the group moving its fullest subset once
it has ended would (a cap filled in save order would not: 64 MB then 128 MB into 128
moves 64). A storage of another size, or at another index, stays (a changed group).

The copies are settled where they would be had they been issued at ``g + k`` (the
scheduler settles them when group ``g + k + 1 + SETTLE_LAG`` starts), so only their
start moves. A storage is produced during its group, not at its start, and a copy
cannot start before its storage is saved: the learning steps mark where each storage
is saved (a mark per storage, in those steps only), the profile keeps each one's
offset from its group's start (``Profile.ready``, the earliest seen), and the queue
model counts each chosen storage's copy from there (queue_plan.py ``copies_end``).
Counted from the group's start instead (where the offsets are unknown, the fallback),
the moe stack's plan picked storages saved at its groups' ends (fc1's 176 MiB output)
as if ready at their starts, and the simulator's compute waited 0.2-0.4 ms per step
at 54-56 GB/s: under the calibration's tolerance (1 % of the step), so never learned.

A step that departs from the profile (another group count or a changed group) is
caught as the next group starts (the planner compares the layout so far) and moves
nothing from there on, as before; a group copied early that turns out to be among the
last ``k`` (a step with fewer groups) stays on the host until its backward reloads it
on demand: correct, only its copy was wasted.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuseops.offload.choice import fullest_subset
from fuseops.offload.planner import Planner, StepLog


@dataclass(frozen=True)
class Picks:
    """The storages an early group moves: bytes by save index in the group."""

    by_index: dict[int, int]

    def take(self, index: int | None, nbytes: int) -> bool:
        """Whether the storage saved ``index``-th in the group (``None``: one the group
        saved before) with ``nbytes`` is one the plan chose."""
        return index is not None and self.by_index.get(index) == nbytes


def early_plan(planner: Planner, log: StepLog, position: int, layout: list[int]) -> tuple[int, Picks | None] | None:
    """The budget of the group starting at ``position`` of ``log``'s step, whose earlier
    groups saved ``layout`` bytes, and its picks (``None`` where the profile has no
    storage sizes: it then fills its budget in save order); ``None`` when it may not
    move yet: the step learns, or the group may be among the last ``keep_last``, or the
    layout so far departs from the profile's (the planner then marks the step diverged)."""
    profile = planner.profile
    if log.learning or profile is None or position + log.keep_last >= len(profile.layout):
        return None
    budget = planner.budget(log, position, layout)
    if budget is None:
        return None
    if len(profile.sizes) != len(profile.layout):
        return budget, None
    sizes = profile.sizes[position]
    return budget, Picks({i: sizes[i] for i in fullest_subset(tuple(sizes), budget)})
