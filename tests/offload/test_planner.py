"""group_budget_bytes="auto" on CPU, under a deterministic clock standing in for events:
it learns, plans from what it learned, reads marks only once passed, learns again when
shapes or layers change; ints and None bypass it."""

import functools
import itertools

import pytest
import torch
from torch import nn

from fuseops.offload import arena as arena_module
from fuseops.offload import host_arena
from fuseops.offload import link as link_module
from fuseops.offload import planner as planner_module
from fuseops.offload.link import HostLink
from fuseops.offload.planner import PINNED_BYTES_PER_S, STALL_TOLERANCE, Planner
from fuseops.offload.timing import CopyMeter
from tests.offload._models import assert_bitwise, mlp_layers, run_step
from tests.offload.test_api import saved_storages_by_group

BYTES_PER_S = 10e6
MARGIN = 0.9


class FakeTimer:
    """Time moves only when a ``Tick`` says so. With ``lag``, marks have not passed (as
    events the device has not reached) until ``release()``: ``seconds`` is then ``None``."""

    def __init__(self, lag: bool = False) -> None:
        self.now, self.lag, self.marks, self.reached = 0.0, lag, 0, -1

    def mark(self, stream=None):
        self.marks += 1
        return (self.marks, self.now)

    def seconds(self, start, end):
        if not (self.passed(start) and self.passed(end)):
            return None
        return end[1] - start[1]

    def passed(self, mark) -> bool:
        return not self.lag or mark[0] <= self.reached

    def elapsed(self, start, end):
        return end[1] - start[1]

    def release(self):
        self.reached = self.marks


class Tick(torch.autograd.Function):
    """Advances the fake clock by ``forward_s`` in forward and ``backward_s`` in backward."""

    @staticmethod
    def forward(ctx, x, timer, forward_s, backward_s):
        timer.now += forward_s
        ctx.timer, ctx.backward_s = timer, backward_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        ctx.timer.now += ctx.backward_s
        return dy, None, None, None


class Timed(nn.Module):
    """A layer whose forward takes ``times[0][i]`` and backward ``times[1][i]`` fake
    seconds: the forward tick after the layer (before the next group's first save), the
    backward tick before it (its backward runs after the layer's own)."""

    def __init__(self, layer: nn.Module, timer: FakeTimer, times: list, i: int) -> None:
        super().__init__()
        self.layer, self.timer, self.times, self.i = layer, timer, times, i

    def forward(self, h):
        forward_s, backward_s = self.times[0][self.i], self.times[1][self.i]
        return Tick.apply(self.layer(Tick.apply(h, self.timer, 0.0, backward_s)), self.timer, forward_s, 0.0)


@pytest.fixture
def timer(monkeypatch):
    timer = FakeTimer()
    planner = Planner(timer, bytes_per_s=BYTES_PER_S, margin=MARGIN)
    monkeypatch.setitem(planner_module._planners, torch.device("cpu"), planner)
    return timer


def timed_layers(timer, times, n, hidden=96):
    return nn.ModuleList(Timed(layer, timer, times, i) for i, layer in enumerate(mlp_layers(n=n, hidden=hidden)))


def moved_within(groups, budgets):
    """Bytes moved when group g moves its storages (>= 1 KiB) in save order while they
    fit in what ``budgets[g]`` has left (groups past ``budgets`` stay)."""
    return sum(fill(storages, left) for storages, left in zip(groups, budgets))


def fill(storages, left):
    moved = 0
    for n in storages:
        if 1024 <= n <= left:
            moved, left = moved + n, left - n
    return moved


def queue_model(times, n, keep_last, rate, first_reload=()):
    """The planner's model, independently: the copies of group g are issued as it saves
    them (these layers save all at the group's start: the fake clock ticks after them)
    and queue on the link after those issued before; they must end by the start of
    group i + 2, i = g + keep_last (or the forward's end), and its reload must fit in
    0.9 of group g + 1's backward (a quarter when g + 1 runs its backward first, until
    that first reload's window has been measured: ``first_reload``, (group, seconds)).
    Returns ``window(g, link_free)``: when group g's copies start, and the most bytes
    they may be."""
    forward, backward = times
    starts = [sum(forward[:i]) for i in range(n + 1)]

    def window(g, link_free):
        i = g + keep_last
        begin = max(starts[g], link_free)
        seconds = starts[min(i + 2, n)] - begin
        if g in dict(first_reload):
            seconds = min(seconds, 0.9 * dict(first_reload)[g])
        elif g + 1 < n:
            seconds = min(seconds, (0.25 if g + 1 >= n - max(keep_last, 1) else 0.9) * backward[g + 1])
        return begin, int(max(0.0, seconds) * rate)

    return window


def byte_budget_moved(layers, x, times, keep_last, rate=BYTES_PER_S, first_reload=()):
    """What a byte budget per group moved (the rule the step's plan replaced): each group
    in turn fills the whole window the queue left it, in save order or largest first."""
    groups = saved_storages_by_group(layers, x)
    window, rate = queue_model(times, len(groups), keep_last, rate * MARGIN, first_reload), rate * MARGIN
    moved, link_free = 0, 0.0
    for g in range(len(groups) - keep_last):
        begin, left = window(g, link_free)
        group_moved = max(fill(groups[g], left), fill(sorted(groups[g], reverse=True), left))
        if group_moved:
            link_free = begin + group_moved / rate
        moved += group_moved
    return moved


def expected_moved(layers, x, times, keep_last, rate=BYTES_PER_S, first_reload=(), caps=None):
    """The most bytes whole storages move in the planner's model (``queue_model``), by
    trying every choice. A group moves any subset of its storages (>= 1 KiB); with
    keep_last=0 it decides them as they are saved, so it moves what save order lets
    through under some cap; ``caps``: the most each group's cap may be, by group."""
    groups = [[n for n in storages if n >= 1024] for storages in saved_storages_by_group(layers, x)]
    n = len(groups)
    window, rate = queue_model(times, n, keep_last, rate * MARGIN, first_reload), rate * MARGIN
    # Per group: (cap, bytes moved under it).
    options = [[(c, fill(s, c) if keep_last == 0 else c) for c in subset_sums(s)] for s in groups]

    @functools.cache
    def most(g, link_free):
        if g == n - keep_last:
            return 0
        begin, left = window(g, link_free)
        left = min(left, caps.get(g, left)) if caps is not None else left
        return max(moved + most(g + 1, begin + moved / rate if moved else link_free)
                   for cap, moved in options[g] if cap <= left)

    return most(0, 0.0)


def eligible_sizes(layers, x):
    """Per group, the storages that may move (>= 1 KiB), in save order: what the planner
    chooses among (``Profile.sizes``)."""
    return tuple(tuple(n for n in storages if n >= 1024) for storages in saved_storages_by_group(layers, x))


def subset_sums(sizes):
    return {sum(c) for r in range(len(sizes) + 1) for c in itertools.combinations(sizes, r)}


def auto_step(layers, x, keep_last):
    step = run_step(layers, x, dict(min_tensor_bytes=1024, keep_last=keep_last, group_budget_bytes="auto"))
    assert_bitwise(step, run_step(layers, x))
    return step.offload.stats


@pytest.mark.parametrize("keep_last", [0, 1, 2])
def test_learns_two_steps_then_plans_each_group_from_the_fastest_times(timer, keep_last):
    # Per layer, forward and backward milliseconds; the first step is slow (warm-up).
    times = [[1e-3, 2e-3, 3e-3, 4e-3], [2e-3, 3e-3, 6e-3, 8e-3]]
    warm_up = [[10 * t for t in row] for row in times]
    layers, x = timed_layers(timer, times, 4), torch.randn(40, 32)
    want = expected_moved(layers, x, times, keep_last)
    assert 0 < want < sum(map(sum, saved_storages_by_group(layers, x)))

    times[:] = warm_up
    learning = auto_step(layers, x, keep_last)
    times[:] = [[t / 10 for t in row] for row in warm_up]
    assert auto_step(layers, x, keep_last)["bytes_offloaded"] == 0
    assert learning["bytes_offloaded"] == 0 and learning["skipped_learning"] > 0
    stats = auto_step(layers, x, keep_last)
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == want
    assert stats["skipped_learning"] == 0 and stats["skipped_budget"] > 0
    # That step measured the first reload's window (from where the first backward group
    # queued it to the reloaded group's backward): later steps plan it from that.
    # (digested as the next step begins).
    for i in range(2):
        stats = auto_step(layers, x, keep_last)
        if i == 0:
            first_reload = planner_module._planners[torch.device("cpu")].profile.first_reload
            assert len(first_reload) == 1 and first_reload[0][1] > 0
            want = expected_moved(layers, x, times, keep_last, first_reload=first_reload)
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == want
        assert stats["skipped_learning"] == 0 and stats["skipped_budget"] > 0


def test_marks_are_read_only_once_passed(monkeypatch):
    timer = FakeTimer(lag=True)
    monkeypatch.setitem(planner_module._planners, torch.device("cpu"), Planner(timer, bytes_per_s=BYTES_PER_S))
    times = [[2e-3] * 3, [4e-3] * 3]
    layers, x = timed_layers(timer, times, 3), torch.randn(40, 32)
    for _ in range(3):
        assert auto_step(layers, x, 1)["bytes_offloaded"] == 0
    timer.release()
    assert auto_step(layers, x, 1)["bytes_offloaded"] == expected_moved(layers, x, times, 1) > 0


class CountingTimer(FakeTimer):
    """A lagging fake clock that counts the queries of each mark."""

    def __init__(self) -> None:
        super().__init__(lag=True)
        self.queries: dict[int, int] = {}

    def passed(self, mark) -> bool:
        self.queries[mark[0]] = self.queries.get(mark[0], 0) + 1
        return super().passed(mark)


def test_a_step_is_read_with_one_query_while_it_runs_and_one_per_mark_once_passed():
    timer = CountingTimer()
    planner = Planner(timer, bytes_per_s=BYTES_PER_S)
    log = planner.begin_step(keep_last=1)
    for _ in range(4):
        log.forward.append(timer.mark())
        timer.now += 1.0
    log.forward_end = timer.mark()
    for position in (3, 2, 1, 0):
        log.backward[position] = timer.mark()
        timer.now += 2.0
    log.layout = [8, 8, 8, 8]
    planner.begin_step(keep_last=1)
    # The device is behind: the step's last mark answers alone.
    assert timer.queries == {log.backward[0][0]: 1}
    timer.queries.clear()
    timer.release()
    planner.poll()
    # Neighbouring spans share marks: each is queried once.
    assert sorted(timer.queries) == list(range(1, 10)) and set(timer.queries.values()) == {1}
    assert planner.profile.forward == (1.0, 1.0, 1.0, 1.0)
    assert planner.profile.backward == (None, 2.0, 2.0, 2.0)


def test_a_change_of_shape_or_of_layers_is_learned_again(timer):
    times = [[2e-3] * 5, [4e-3] * 5]
    layers = timed_layers(timer, times, 5)
    four = nn.ModuleList(layers[:4])
    small, large = torch.randn(40, 32), torch.randn(56, 32)
    for _ in range(2):
        auto_step(four, small, 1)
    assert auto_step(four, small, 1)["bytes_offloaded"] == expected_moved(four, small, times, 1) > 0
    # More rows: every group saves more, the first departs from the profile: nothing
    # moves until the new layout is learned.
    times[:] = [[t * 1.5 for t in row] for row in times]
    for _ in range(2):
        stats = auto_step(four, large, 1)
        assert stats["bytes_offloaded"] == 0 and stats["skipped_learning"] > 0
    assert auto_step(four, large, 1)["bytes_offloaded"] == expected_moved(four, large, times, 1) > 0
    # Planned again over the new shape's storages: each cap is a sum of some of them.
    planner = planner_module.planner_for(torch.device("cpu"))
    assert planner.profile.sizes == eligible_sizes(four, large)
    assert all(cap in subset_sums(planner.profile.sizes[g]) for g, cap in planner.planned.items())
    # A fifth layer: the groups that match the profile are planned, the new ones learn;
    # then the five-group layout learns (a step) and is planned.
    times[:] = [[t * 1.5 for t in row] for row in times]
    first = auto_step(layers, large, 1)
    assert first["skipped_learning"] > 0 and first["groups"] == 5
    assert auto_step(layers, large, 1)["bytes_offloaded"] == 0
    assert auto_step(layers, large, 1)["bytes_offloaded"] == expected_moved(layers, large, times, 1) > 0


@pytest.mark.parametrize("budget", [None, 20_000, 0])
def test_ints_and_none_bypass_the_planner(timer, budget):
    times = [[2e-3] * 3, [4e-3] * 3]
    layers, x = timed_layers(timer, times, 3), torch.randn(40, 32)
    step = run_step(layers, x, dict(min_tensor_bytes=1024, group_budget_bytes=budget))
    assert timer.marks == 0
    assert_bitwise(step, run_step(layers, x))
    stats = step.offload.stats
    assert stats["skipped_learning"] == 0
    groups = saved_storages_by_group(layers, x)
    cap = float("inf") if budget is None else budget
    assert stats["bytes_offloaded"] == moved_within(groups, [cap] * (len(groups) - 1))
    assert (stats["skipped_budget"] > 0) == (budget is not None)


def test_the_default_budget_is_auto(timer):
    times = [[2e-3] * 3, [4e-3] * 3]
    layers, x = timed_layers(timer, times, 3), torch.randn(40, 32)
    step = run_step(layers, x, dict(min_tensor_bytes=1024))
    assert step.offload.stats["bytes_offloaded"] > 0  # run_step's configs say None unless told
    from fuseops.offload import offload_activations

    with offload_activations(min_tensor_bytes=1024) as handle:
        h = x.clone().requires_grad_()
        for layer in layers:
            with handle.group():
                h = h + layer(h)
    h.sum().backward()
    assert handle.stats["skipped_learning"] > 0 and timer.marks > 0


def test_bandwidth_is_measured_from_copies_once_they_have_passed():
    timer = FakeTimer(lag=True)
    meter = CopyMeter(timer)
    timer.now = 1.0
    start = timer.mark()
    timer.now = 1.5
    meter.record(start, timer.mark(), 10_000_000)
    assert meter.bytes_per_s() is None
    start = timer.mark()
    timer.now = 2.0
    meter.record(start, timer.mark(), 40_000_000)
    timer.release()
    # Summed over copies: 50 MB in 1 s, not the mean of 20 and 80 MB/s.
    assert meter.bytes_per_s() == pytest.approx(50e6)
    assert Planner(timer).bytes_per_s() == PINNED_BYTES_PER_S


def test_whole_tensors_still_fill_what_the_link_hides(timer):
    # Each layer saves 5, 5, 15 and 15 KiB-ish storages (its input, the norm's output, the
    # GELU's input and output) and a layer's forward hides 18 kB: per group, whole tensors
    # fill 10 kB of it at best. Queued on one link, a group's leftover goes to the next.
    n = 8
    times = [[2e-3] * n, [8e-3] * n]
    layers, x = timed_layers(timer, times, n), torch.randn(40, 32)
    for _ in range(2):
        auto_step(layers, x, 1)
    stats = auto_step(layers, x, 1)
    hidden_by_link = sum(times[0][1:]) * BYTES_PER_S * MARGIN
    assert stats["bytes_offloaded"] == expected_moved(layers, x, times, 1)
    # Digested as the next step begins: per group, what that step moved stays within its
    # group's budget and sums to the step's bytes.
    planner = planner_module.planner_for(torch.device("cpu"))
    planned = dict(planner.planned)
    auto_step(layers, x, 1)
    moved_by_group = planner.last_moved
    assert sum(moved_by_group.values()) == stats["bytes_offloaded"]
    assert all(0 < n <= planned[g] for g, n in moved_by_group.items()), (moved_by_group, planned)
    assert stats["bytes_offloaded"] >= 0.9 * hidden_by_link, (stats["bytes_offloaded"], hidden_by_link)


def test_the_step_plan_moves_more_whole_storages_than_a_byte_budget_per_group(timer):
    # Per layer: 5120 B storages (its input, the norm's output) and 25600 B ones (the
    # GELU's input and output). Each group filling the window the queue left it took a
    # 25600 and a 5120 B storage in group 0, which left group 1 too little for a 25600
    # one (two 5120 B ones); the plan over the whole step moves 25600 B in each of groups
    # 0 and 1 (the link time group 0 leaves lets group 1's fit) and 25% more in all.
    times = [[1.2e-3, 1.5e-3, 1.6e-3, 1.7e-3], [6.8e-3, 4.9e-3, 5.0e-3, 2.2e-3]]
    layers, x = timed_layers(timer, times, 4, hidden=160), torch.randn(40, 32)
    planner = planner_module.planner_for(torch.device("cpu"))
    for _ in range(3):
        auto_step(layers, x, 1)
    assert planner.profile.sizes == eligible_sizes(layers, x)
    first_reload = planner.profile.first_reload
    want = expected_moved(layers, x, times, 1, first_reload=first_reload)
    assert want > byte_budget_moved(layers, x, times, 1, first_reload=first_reload)
    for _ in range(2):
        assert auto_step(layers, x, 1)["bytes_offloaded"] == want
    # A group's budget is the sum of the storages chosen for it: it moves all of it.
    assert planner.last_moved == {g: cap for g, cap in planner.planned.items() if cap > 0}


@pytest.mark.parametrize("efficiency", [0.9, 0.7, 0.5])
def test_a_settled_plan_planned_again_never_grows_a_budget(timer, efficiency):
    # Once settled, the plan changes only to shrink (a calibration lowers the efficiency,
    # as here, or a first reload's window is measured shorter): planned again over the
    # whole queue, a group may be the one to take a storage more than in the last plan
    # if the link allowed it, but never more than that plan gave it, so no host block is
    # allocated.
    n = 6
    times = [[2e-3] * n, [8e-3] * n]
    layers, x = timed_layers(timer, times, n, hidden=160), torch.randn(40, 32)
    planner = planner_module.planner_for(torch.device("cpu"))
    for _ in range(5):
        auto_step(layers, x, 1)
    settled, arena = dict(planner.planned), host_arena("cpu")
    allocations = arena.allocations
    planner.efficiency *= efficiency
    moved = [auto_step(layers, x, 1)["bytes_offloaded"] for _ in range(2)]
    assert moved[0] == moved[1] == expected_moved(layers, x, times, 1, rate=BYTES_PER_S * efficiency,
                                                 first_reload=planner.profile.first_reload, caps=settled)
    assert all(planner.planned[g] <= settled[g] for g in settled), (settled, planner.planned)
    assert arena.allocations == allocations


def test_no_host_block_is_allocated_once_the_plan_has_settled(timer, monkeypatch):
    # The measured bandwidth rises step after step (as a meter's sum does when its first
    # copies were slow): a budget that followed it would move more and take new blocks.
    n = 6
    times = [[2e-3] * n, [8e-3] * n]
    layers, x = timed_layers(timer, times, n), torch.randn(40, 32)
    planner = planner_module._planners[torch.device("cpu")]
    rates = iter([BYTES_PER_S * (1 + 0.25 * i) for i in range(100)])
    monkeypatch.setattr(planner, "bytes_per_s", lambda: next(rates))
    # A fresh arena (and a link that takes from it): blocks other tests left free would
    # hide an allocation.
    monkeypatch.setattr(arena_module, "_arenas", {})
    monkeypatch.setattr(link_module, "_links", {})
    # Two steps learn, the first planned one is provisional; the one after it is planned
    # afresh from what it measured: the never-grow rule starts there (planner.py).
    for _ in range(4):
        moved = auto_step(layers, x, 1)["bytes_offloaded"]
    assert not planner.provisional
    arena = host_arena("cpu")
    allocations = arena.allocations
    for _ in range(3):
        assert auto_step(layers, x, 1)["bytes_offloaded"] == moved > 0
    assert arena.allocations == allocations > 0


class QueuedLink:
    """Copies out that run at ``rate`` in fake time, one queue: each ends ``bytes / rate``
    after the link frees, so compute that settles them sooner waits (the stall)."""

    def __init__(self, timer: FakeTimer, rate: float) -> None:
        self.timer, self.rate, self.free = timer, rate, 0.0

    def install(self, monkeypatch) -> None:
        copy_out = HostLink.copy_out

        def queued(link, sources, after):
            blocks, _ = copy_out(link, sources, after)
            self.free = max(self.timer.now, self.free) + sum(s.numel() for s in sources) / self.rate
            return blocks, (self.timer.mark()[0], self.free)

        monkeypatch.setattr(HostLink, "copy_out", queued)
        monkeypatch.setattr(HostLink, "passed", lambda link, done: done is None or done[1] <= self.timer.now)
        monkeypatch.setattr(HostLink, "settle", lambda link, done: self.wait(done))

    def wait(self, done) -> None:
        # Compute waits: its clock moves on to the copies' end.
        self.timer.now = max(self.timer.now, done[1])


@pytest.mark.parametrize("achieved", [1.0, 0.5])
def test_a_link_slower_beside_compute_than_measured_is_calibrated_down(timer, monkeypatch, achieved):
    # The bandwidth measured (BYTES_PER_S) is what copies achieve alone; beside compute
    # they run at ``achieved`` of it. Compute waits for them where the scheduler settles
    # them: the planner learns that wait from the marks and plans less, until planned
    # steps wait for at most STALL_TOLERANCE of their compute.
    n = 6
    times = [[2e-3] * n, [8e-3] * n]
    layers, x = timed_layers(timer, times, n), torch.randn(40, 32)
    QueuedLink(timer, BYTES_PER_S * achieved).install(monkeypatch)
    planner = planner_module._planners[torch.device("cpu")]
    seen = []
    calibrate = planner._calibrate
    monkeypatch.setattr(planner, "_calibrate", lambda log, stalled: (seen.append(stalled), calibrate(log, stalled)))
    for _ in range(2):
        auto_step(layers, x, 1)
    moved = [auto_step(layers, x, 1)["bytes_offloaded"] for _ in range(6)]
    assert moved[0] == expected_moved(layers, x, times, 1)
    compute = sum(times[0]) + sum(times[1][1:])
    # Digested: the second learning step, then each planned step but the last.
    assert len(seen) == 6 and seen[-1] <= STALL_TOLERANCE * compute
    if achieved == 1.0:
        assert planner.efficiency == 1.0 and moved == [moved[0]] * 6 and seen == [0.0] * 6
    else:
        assert seen[1] > STALL_TOLERANCE * compute and planner.efficiency < 1.0
        assert moved[-1] < moved[0]
        # It still moves what the slower link hides (whole tensors, the same margin).
        assert moved[-1] >= 0.9 * expected_moved(layers, x, times, 1, rate=BYTES_PER_S * achieved)


def test_a_wait_the_measured_bandwidth_explains_does_not_lower_the_efficiency(monkeypatch):
    # The first planned step plans at PINNED_BYTES_PER_S (learning steps move nothing, so
    # no copy has been measured); the link really runs at 0.9 of it, as measured since.
    # Compute waited exactly the longer copies: the measurement explains that wait, the
    # efficiency stays. A wait twice as long is the link's own shortfall beside compute.
    from fuseops.offload.planner import Profile, StepLog

    planner, margin = Planner(FakeTimer()), 0.95
    planner.profile = Profile((1,), 1, (10e-3,), (None,), 3)
    moved, planned_rate, measured = 500e6, PINNED_BYTES_PER_S, 0.9 * PINNED_BYTES_PER_S
    monkeypatch.setattr(planner, "bytes_per_s", lambda: measured)
    planned_s, real_s = moved / (planned_rate * margin), moved / (measured * margin)
    for extra, efficiency in ((1, 1.0), (2, real_s / (planned_s + 2 * (real_s - planned_s)))):
        log = StepLog(1, moved=int(moved), bytes_per_s=planned_rate, efficiency=1.0)
        planner.efficiency = 1.0
        planner._calibrate(log, extra * (real_s - planned_s))
        assert planner.efficiency == pytest.approx(efficiency)
    assert planner.efficiency < 0.95
