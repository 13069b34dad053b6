"""``group_budget_bytes="auto"``: per-group budgets learned from the run's own timings.

The link is modelled as the device-to-host stream it is: one queue. A planned group
``g`` (not among the profile's last ``keep_last``) issues its copies as it saves its
tensors (early.py; without a known layout they wait for group ``i = g + keep_last`` to
start), each starting once it is saved and the copies queued before it are done; the
scheduler settles them (the compute stream waits) when group ``i + 1 + SETTLE_LAG``
starts, or when the forward ends. So group ``g`` may move

    (min(start[i + 1 + SETTLE_LAG], forward end) - max(start[g], link free)) x bandwidth x margin

where ``link free`` is when the copies of the step's earlier groups end, and the plan
counts each storage's copy from its save (``Profile.ready``: where learning steps saw
it saved, queue_plan.py). Tensors move
whole: a group moves one of its subset sums of storages, rarely its whole window. What
it leaves on the link, later groups use, so the choice is made over the whole step
(queue_plan.py): the planner walks the step's groups with the queue and picks, per
group, the subset sum that keeps every group within its window and moves the most bytes
in all (a group may move less than it could so that a later one fits a whole storage
more). For that the profile holds each group's storage sizes (``Profile.sizes``, which
the scheduler records per storage, as it records the layout). Each group's budget is
the sum chosen for it, and the scheduler moves the fullest subset of its storages under
it (choice.py): that sum. So ``planned`` is what moves, not a window that whole
storages fill in part (a byte budget per group, filled in order, left 20-45 % of the
H100's budgets unused; the moe stack moved 0.80-0.83 of what the link hides). The plan
is made once per profile and rate, not per step; a step whose earlier groups moved more
than planned (storages not the profile's) clips the later budgets to the window its
real queue leaves (``copy_limit``).
The host-to-device copy of group ``g`` runs inside the backward of group ``g + 1``:
over most of it (``RELOAD_WINDOW``; the scheduler prefetches as soon as memory freed by
that backward, or left free by what earlier groups kept, lets it), but only over its tail
(``FIRST_RELOAD_WINDOW``) when group ``g + 1`` is the first to run its backward: there
the prefetch waits until that backward is past its own peak (scheduler.py), so the
group before it plans small. That guess holds until a planned step has measured the
real window (the scheduler marks where it queues that reload; ``Profile.first_reload``:
0.54 of the layer's backward in the H100 mlp stack, 0.09 in the moe one).

The first planned step plans before anything of the link was measured (learning steps
move nothing): at ``PINNED_BYTES_PER_S`` and the guessed first window. Its budgets are
provisional: once it is digested, the planner plans afresh from what it measured (the
budgets' never-grow rule below starts there). Without that, budgets set at the default
bandwidth and a queue that ran on it stayed the minimum of both models (simulator:
the mlp stack moved 0.86-0.89 of what the link hides, 0.91-0.94 planned afresh).

The scheduler marks, per step, when each group starts its forward, when the forward
ends and when each group starts its backward (``StepLog``), and in learning steps where
each storage that may move is saved (``StepLog.saves``). Marks are read only once
they have passed (``Timer.passed``; the host never waits on one), at the
start of later groups: a step is digested a step or two after it ran (or more, when
the host runs steps ahead of the device and never synchronises). The first
``learn_steps`` steps with a given layout (the eligible bytes of each group, which
also fixes the group count) move nothing, so that they measure compute alone; later
steps plan from the smallest time seen per group (warm-up and any stall only ever
lengthen a time). A group's budget never grows once planned for a layout (but where the
profile's first efficiency cut is tried again, below, and the budgets from before it
return): the host blocks its copies took are then all a planned step needs, and no pinned
memory is allocated once the plan has settled; a plan made again (a lower efficiency, a
first reload's window measured) chooses over the whole step under those budgets as caps.
Once planned afresh, steps plan from the timings and the bandwidth that plan was made
from (only a first reload's window and the link efficiency still change, and both only
shrink budgets, but for a retried cut): replanned from each step's new minima, the
never-grow rule kept every group's lowest variant of a plan that noise
reshuffles (whole tensors: a group that moves less leaves the next more link), and a
GPU's step-to-step variation ratcheted the step down (simulator, +-2 % node times:
mlp 0.81 of what the link hides, 0.93 held). A step whose layout departs from the profile's
moves nothing from that group on, and its measurement starts a new profile: shapes or
layers that change are learned again.

Bandwidth: the link's own copies, measured (``CopyMeter``; read once as each step
begins); until one has been read, ``PINNED_BYTES_PER_S``, measured on the H100 machine. Times that measured bandwidth, an
efficiency: the share of it that copies achieve beside this compute, in these windows.
The scheduler marks the compute stream where it makes compute wait for copies (a group's
copies out at their settle point, a reload where it is consumed); a planned step whose
compute waited past the copies' end for more than ``STALL_TOLERANCE`` of its compute
moved its bytes that much slower than planned, and sets the efficiency to the share of
the bandwidth measured now that this rate is (``_calibrate``: a wait that the measured
bandwidth already explains, as the first planned step's at the default bandwidth, cuts
nothing). So the plan follows what the scheduler really overlaps (copies that share
the device's memory with compute, a reload that starts late), not the bandwidth of a
copy alone. The efficiency falls, but the profile's first cut is tried again once, with the
budgets from before it, after ``RESTORE_AFTER`` planned steps that waited on nothing (a single
wait may be a hiccup, not the link); a cut after that stands. It starts afresh with a new
profile.
Steps that learn move nothing and keep no records: their groups pass tensors through.
tests/offload/_device_sim.py runs this planner and the scheduler on a simulated device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fuseops.offload.link import link_for
from fuseops.offload.queue_plan import Profile, StepPlan, copy_limit, plan_step
from fuseops.offload.timing import Timer, timer_for

# Pinned host<->device copies measured on the H100 machine: 53-55 GB/s each way.
PINNED_BYTES_PER_S = 54e9
# Calibration: a planned step whose compute waited on the link (copies out at their
# settle point, reloads where they are consumed) for more than this share of its compute
# lowers the planner's link efficiency (see ``Planner._calibrate``).
STALL_TOLERANCE = 0.01
# A cut efficiency is tried again once, with the budgets from before the cut, after this many
# planned steps in a row that waited on nothing (``Planner._calibrate``).
RESTORE_AFTER = 3


@dataclass(eq=False)
class StepLog:
    """One step's marks, by group position in the step; ``layout``: eligible bytes per
    group, filled as groups end; ``diverged``: the layout left the profile's."""

    keep_last: int
    forward: list[Any] = field(default_factory=list)
    forward_end: Any = None
    backward: dict[int, Any] = field(default_factory=dict)
    layout: list[int] = field(default_factory=list)
    # Per group, the bytes of each storage that may move (``Profile.sizes``), filled alike.
    sizes: list[tuple[int, ...]] = field(default_factory=list)
    # Learning steps: per group, the marks where those storages were saved (``Profile.ready``).
    saves: list[list[Any]] = field(default_factory=list)
    diverged: bool = False
    closed: bool = False
    # The profile was not ready as the step began: the whole step measures, moving nothing
    # (its groups pass their tensors through, scheduler.py).
    learning: bool = False
    # When the copies issued so far in this step end, in the profile's seconds.
    link_free: float = 0.0
    # Planned steps: bytes moved, the bandwidth and efficiency planned with (read once as
    # the step begins: one link model for all its groups, and no copy marks re-read per
    # group), and where compute waited for copies: (mark on the compute stream before
    # the wait, the copies' end mark).
    moved: int = 0
    # The same by group position (a diagnostic: what the plan's budgets let through).
    moved_by_group: dict[int, int] = field(default_factory=dict)
    bytes_per_s: float = PINNED_BYTES_PER_S
    efficiency: float = 1.0
    stalls: list[tuple[Any, Any]] = field(default_factory=list)
    waited: set[int] = field(default_factory=set)
    # Where the first group to run its backward queued the reload of the group before it
    # (a mark on the compute stream: the reload's copies wait for compute queued so far),
    # and that group's position: the reload has until that group's backward starts.
    first_reload: tuple[Any, int] | None = None


class Planner:
    """Learns per-group timings of one device and plans budgets from them.

    Args:
        timer: where marks come from (CUDA events, the host clock, or a test's fake).
        device: whose link measures the bandwidth when ``bytes_per_s`` is ``None``.
        bytes_per_s: a fixed bandwidth instead of the measured one.
        margin: the fraction of the link to plan for (copies also share memory bandwidth).
        learn_steps: steps measured (moving nothing) before a layout is planned.
    """

    def __init__(self, timer: Timer, *, device: torch.device | None = None, bytes_per_s: float | None = None,
                 margin: float = 0.95, learn_steps: int = 2) -> None:
        self.timer, self.device = timer, device
        self.fixed_bytes_per_s, self.margin, self.learn_steps = bytes_per_s, margin, learn_steps
        self.profile: Profile | None = None
        # The share of the measured bandwidth that copies achieve beside compute: 1 until
        # a planned step stalls on the link (``_calibrate``); only ever lowered per profile.
        self.efficiency = 1.0
        # Per group position, the budget last planned for the profile's layout: the sum of
        # the storages the step's plan chose for the group (``_step_plan``).
        self.planned: dict[int, int] = {}
        # Seconds compute waited on the link in the last step digested (a diagnostic: a
        # step slower than its compute by much more than this is not waiting on copies).
        self.last_stall_s = 0.0
        # Per group position, the bytes the last planned step digested moved (a diagnostic
        # beside ``planned``, which it equals where the step's storages were the profile's).
        self.last_moved: dict[int, int] = {}
        # The budgets in ``planned`` were planned before anything of the link was measured
        # (the default bandwidth, the first reload's window guessed): the first planned
        # step digested plans afresh once, from what it measured (``_learn``).
        self.provisional = True
        # Once planned afresh, the timings and the bandwidth that plan was made from: later
        # steps plan from these, not from each step's new minima and meter reading (see
        # ``_learn``), so that noise cannot ratchet the never-growing budgets down.
        self._frozen_bytes_per_s: float | None = None
        # The step plan ``planned`` holds, and what it was planned from: the profile, the
        # rate, the profile's contents (``_step_plan``).
        self._plan: tuple[Profile, float, tuple, StepPlan] | None = None
        # The efficiency and budgets before the profile's first cut, until they are tried
        # again (``_calibrate``); planned steps since the last wait; whether the profile
        # has tried them again already (once: a second cut stands).
        self._before_cut: tuple[float, dict[int, int]] | None = None
        self._clean_steps = 0
        self._restored = False
        self._logs: list[StepLog] = []

    def begin_step(self, keep_last: int) -> StepLog:
        for log in self._logs:
            log.closed = True
        self.poll()
        profile = self.profile
        log = StepLog(keep_last)
        log.learning = profile is None or profile.steps < self.learn_steps or profile.keep_last != keep_last
        log.efficiency = self.efficiency
        log.bytes_per_s = self._planning_bytes_per_s()
        self._logs.append(log)
        return log

    def bytes_per_s(self) -> float:
        if self.fixed_bytes_per_s is not None:
            return self.fixed_bytes_per_s
        measured = link_for(self.device).meter.bytes_per_s() if self.device is not None else None
        return measured if measured is not None else PINNED_BYTES_PER_S

    def _planning_bytes_per_s(self) -> float:
        """The bandwidth steps plan with: the one measured when the plan was made afresh,
        else the measurement now."""
        frozen = self._frozen_bytes_per_s
        return frozen if frozen is not None else self.bytes_per_s()

    def achieved_bytes_per_s(self) -> float:
        """What the plan counts on: the measured bandwidth times the calibrated efficiency."""
        return self._planning_bytes_per_s() * self.efficiency

    def _rate(self, log: StepLog) -> float:
        """Bytes per second the link is planned to move in ``log``'s step."""
        return log.bytes_per_s * log.efficiency * self.margin

    def _step_plan(self, log: StepLog, profile: Profile) -> StepPlan:
        """The whole step's choice (queue_plan.py) for ``profile`` at ``log``'s rate: made
        again only when either changed (a replan under the caps it set chooses the same).
        Called per group: the profile object answers first, its contents once per new one."""
        rate = self._rate(log)
        cached = self._plan
        if cached is not None and cached[0] is profile and cached[1] == rate:
            return cached[3]
        key = (profile.layout, profile.keep_last, profile.forward, profile.backward, profile.first_reload,
               profile.sizes)
        if cached is not None and cached[1] == rate and cached[2] == key:
            plan = cached[3]
        else:
            plan = plan_step(profile, log.keep_last, rate, self.planned)
            self.planned.update(enumerate(plan.caps))
        self._plan = (profile, rate, key, plan)
        return plan

    def budget(self, log: StepLog, position: int, layout: list[int]) -> int | None:
        """Bytes group ``position`` of ``log`` may move, given the eligible bytes of the
        step's groups known so far; ``None`` while learning (it moves nothing). Its
        fullest subset of storages under it is what the step's plan chose for it."""
        profile = self.profile
        issued = position + log.keep_last
        if (log.learning or log.diverged or profile is None or profile.steps < self.learn_steps
                or profile.keep_last != log.keep_last or issued >= len(profile.layout)
                or tuple(layout) != profile.layout[: len(layout)]):
            log.diverged = log.diverged or (profile is not None and profile.steps >= self.learn_steps)
            return None
        plan = self._step_plan(log, profile)
        budget = plan.caps[position]
        if log.moved > plan.before[position]:
            # Earlier groups moved more than planned for them (their storages were not the
            # profile's, or the plan changed in the step): the link frees later than planned.
            budget = min(budget, copy_limit(profile, position, log.keep_last, log.link_free, self._rate(log))[1])
        # Never more than planned before for this layout: no new host blocks once settled.
        budget = min(budget, self.planned.get(position, budget))
        self.planned[position] = budget
        return budget

    def moved(self, log: StepLog, position: int, nbytes: int) -> None:
        """Group ``position`` of ``log`` issued copies of ``nbytes``: the link is busy
        that much longer (its budget was planned, so the profile is ``log``'s)."""
        profile = self.profile
        if nbytes <= 0 or profile is None:
            return
        log.moved += nbytes
        log.moved_by_group[position] = log.moved_by_group.get(position, 0) + nbytes
        # Issued as the group saves them (early.py), counted from the group's start, not
        # each save: ``link_free`` only clips later budgets when a step's groups moved
        # more than planned (``budget``), and an earlier start clips less there.
        start = max(profile.starts[position], log.link_free)
        log.link_free = start + nbytes / self._rate(log)

    def waiting(self, log: StepLog, done: Any, at: Any = None) -> None:
        """The compute stream is about to wait for the copies that end at ``done``: mark it
        there (once per ``done``), so that the wait is learned once both have passed.
        ``at``: a mark of ``log`` already at that point of the compute stream (no work
        queued since), used rather than a new one."""
        if done is None or id(done) in log.waited:
            return
        log.waited.add(id(done))
        log.stalls.append((at if at is not None else self.timer.mark(), done))

    def poll(self) -> None:
        """Digest closed steps whose marks have all passed, oldest first; never waits."""
        while self._logs and self._logs[0].closed:
            times = self._times(self._logs[0])
            if times is None:
                return
            log = self._logs.pop(0)
            self._learn(log, *times)
            self._reuse_marks(log)

    def _reuse_marks(self, log: StepLog) -> None:
        """A digested step's own marks go back to the timer (where it takes them back):
        all have passed, and only ``log`` held them. Not the copies' end marks in
        ``stalls``: records and host blocks wait on those."""
        reuse = getattr(self.timer, "reuse", None)
        if reuse is None or log.forward_end is None or not log.forward:
            return
        # Only marks ``_times`` saw pass: a backward mark outside every span (a backward
        # cut short, a single group) was never queried.
        backward = log.backward
        queried = {q for p in range(1, len(log.forward)) if p in backward and p - 1 in backward for q in (p - 1, p)}
        marks = [*log.forward, log.forward_end, *(wait for wait, _ in log.stalls), *_save_marks(log)]
        if log.first_reload is not None and log.first_reload[1] in backward:
            marks.append(log.first_reload[0])
            queried.add(log.first_reload[1])
        marks.extend(backward[q] for q in queried)
        # A stall may share its mark with a group's start (``waiting``'s ``at``): each once.
        marks = list({id(m): m for m in marks}.values())
        # Cleared so that nothing reads them through ``log`` once they are recorded again.
        log.forward, log.forward_end, log.backward, log.stalls, log.first_reload = [], None, {}, [], None
        log.saves = []
        reuse(marks)

    def _times(self, log: StepLog) -> tuple[list[float], list[float | None], float, tuple[int, float] | None,
                                            list[tuple[float, ...]] | None] | None:
        if log.forward_end is None or not log.forward:
            # Nothing to learn from (no group, or a forward never ended): drop it.
            return [], [], 0.0, None, None
        timer, n = self.timer, len(log.forward)
        spans = [p for p in range(1, n) if p in log.backward and p - 1 in log.backward]
        reload = None
        if log.first_reload is not None:
            mark, position = log.first_reload
            end = log.backward.get(position)
            if end is not None:
                reload = (position, mark, end)
        # Polled at every group's start while the host runs ahead of the device: the marks
        # the step recorded last are queried first (one query while the step still runs),
        # and each mark once, though neighbouring spans share theirs.
        used = sorted({q for p in spans for q in (p - 1, p)})
        marks = [log.backward[q] for q in used]
        marks.append(log.forward_end)
        marks.extend(reversed(log.forward))
        for pair in log.stalls:
            marks.extend(pair)
        if reload is not None:
            marks.append(reload[1])
            if reload[0] not in used:
                marks.append(reload[2])
        saves = _save_marks(log)
        marks.extend(saves)
        passed_all = getattr(timer, "passed_all", None)
        if not (passed_all(marks) if passed_all is not None else all(map(timer.passed, marks))):
            return None
        profile = self.profile
        if (not self.provisional and profile is not None and profile.layout == tuple(log.layout)
                and profile.keep_last == log.keep_last and n == len(profile.forward)):
            # Planned afresh: ``_learn`` keeps the profile's own timings for its layout, so
            # the spans are not read (an ``elapsed_time`` call each, every step).
            forward, backward = list(profile.forward), list(profile.backward)
        else:
            ends = log.forward[1:] + [log.forward_end]
            forward = [timer.elapsed(a, b) for a, b in zip(log.forward, ends)]
            backward = [None] * n
            for position in spans:
                backward[position] = timer.elapsed(log.backward[position], log.backward[position - 1])
        stalled = sum(max(0.0, timer.elapsed(wait, done)) for wait, done in log.stalls)
        first_reload = None if reload is None else (reload[0], timer.elapsed(reload[1], reload[2]))
        ready = None
        if saves:
            ready = [tuple(timer.elapsed(start, m) for m in group)
                     for start, group in zip(log.forward, log.saves)]
        return forward, backward, stalled, first_reload, ready

    def _learn(self, log: StepLog, forward: list[float], backward: list[float | None], stalled: float,
               first_reload: tuple[int, float] | None, ready: list[tuple[float, ...]] | None) -> None:
        if not forward or len(log.layout) != len(forward):
            return
        profile = self.profile
        layout = tuple(log.layout)
        sizes = tuple(log.sizes) if len(log.sizes) == len(layout) else ()
        # Where each storage was saved, by group: kept only where it matches the sizes.
        ready = tuple(ready) if ready is not None and sizes and all(
            len(r) == len(s) for r, s in zip(ready, sizes)) and len(ready) == len(sizes) else ()
        if profile is None or profile.layout != layout or profile.keep_last != log.keep_last:
            self.profile = Profile(layout, log.keep_last, tuple(forward), tuple(backward), 1, sizes=sizes, ready=ready)
            self.planned, self._plan, self.efficiency, self.provisional = {}, None, 1.0, True
            self._frozen_bytes_per_s = None
            self._before_cut, self._clean_steps, self._restored = None, 0, False
            return
        if not self.provisional:
            # Planned afresh already: the timings stay those of that plan (a budget never
            # grows, so budgets replanned from each step's jittered minima only ever took
            # the lowest of every group's variants: a group that moved a 64 MB tensor
            # rather than a 256 MB one left the next more link; simulator with +-2 % node
            # times, mlp at 48 GB/s: 0.81 of what the link hides, 0.93 frozen). A first
            # reload's window is still learned (a position that starts moving measures
            # its own), and stalls still calibrate the efficiency: both only shrink budgets.
            forward, backward = list(profile.forward), list(profile.backward)
        merged = tuple(b if a is None else a if b is None else min(a, b) for a, b in zip(profile.backward, backward))
        reloads = dict(profile.first_reload)
        if first_reload is not None:
            position, seconds = first_reload
            reloads[position] = min(seconds, reloads.get(position, seconds))
        self.profile = Profile(layout, log.keep_last, tuple(map(min, profile.forward, forward)), merged,
                               profile.steps + 1, tuple(sorted(reloads.items())), sizes or profile.sizes,
                               _earliest(profile.ready, ready))
        self.last_stall_s = stalled
        if not log.learning:
            self.last_moved = dict(sorted(log.moved_by_group.items()))
        self._calibrate(log, stalled)
        if self.provisional and not log.learning and log.moved > 0:
            # The first planned step measured the link's bandwidth and the first reload's
            # window: plan once more from those (the host blocks its copies took stay
            # free in the arena, which lends a larger free block before allocating).
            self.provisional, self.planned, self._plan = False, {}, None
            self._frozen_bytes_per_s = self.bytes_per_s()

    def _calibrate(self, log: StepLog, stalled: float) -> None:
        """A planned step's compute waited ``stalled`` seconds for its copies: the link
        moved ``log.moved`` bytes in that much longer than planned (at the bandwidth and
        efficiency ``log`` was planned with), a rate it achieves beside this compute, in
        these windows. The efficiency becomes that rate's share of the bandwidth measured
        now: a wait that the measurement already explains (the first planned step plans
        at ``PINNED_BYTES_PER_S``, before any copy was measured) cuts nothing, and steps
        planned before an update do not cut twice. Waits under ``STALL_TOLERANCE`` of the
        step's compute are noise the margin covers.

        A single wait may be a hiccup rather than the link (benchmarks/offload.py's moe stack
        on an H100: a wait in a timed step that cut the efficiency to 0.895 for good left the
        steps moving 0.72 of what the link hides; the plan without the cut moves 0.92, replayed
        offline from that run's profile). So the profile's first cut is tried again once: after
        ``RESTORE_AFTER`` planned steps in a row that waited on nothing, the efficiency and
        budgets from before it return (their host blocks are held: no pinned memory is
        allocated). A cut after that stands."""
        profile = self.profile
        compute = sum(profile.forward) + sum(t for t in profile.backward if t is not None)
        if log.moved <= 0:
            return
        if stalled <= STALL_TOLERANCE * compute:
            # Steps planned before the efficiency changed say nothing of the current plan.
            if log.efficiency == self.efficiency:
                self._clean_steps += 1
            if self._before_cut is not None and self._clean_steps >= RESTORE_AFTER:
                self.efficiency, planned = self._before_cut
                self.planned, self._plan, self._before_cut, self._restored = dict(planned), None, None, True
            return
        self._clean_steps = 0
        planned = log.moved / (log.bytes_per_s * log.efficiency * self.margin)
        achieved = log.moved / (planned + stalled)
        cut = achieved / (self._planning_bytes_per_s() * self.margin)
        if cut < self.efficiency and not self.provisional and not self._restored and self._before_cut is None:
            self._before_cut = (self.efficiency, dict(self.planned))
        self.efficiency = min(self.efficiency, cut)

def _save_marks(log: StepLog) -> list[Any]:
    """``log``'s save marks, when it has them for every group (a learning step's)."""
    if len(log.saves) != len(log.forward) or not any(log.saves):
        return []
    return [m for group in log.saves for m in group]


def _earliest(old: tuple, new: tuple) -> tuple:
    """Per storage, the earliest save seen (as times, warm-up and stalls only delay one),
    where both steps saved the same storages; else the one known."""
    if not old or not new:
        return old or new
    if [len(g) for g in old] != [len(g) for g in new]:
        return new
    return tuple(tuple(map(min, a, b)) for a, b in zip(old, new))


_planners: dict[torch.device, Planner] = {}


def planner_for(device: torch.device) -> Planner:
    """The process-wide planner of ``device`` (what it learned outlives each context)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _planners:
        _planners[device] = Planner(timer_for(device), device=device)
    return _planners[device]
