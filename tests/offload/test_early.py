"""Early copies (early.py) on CPU under a deterministic clock: with "auto" and a known
layout, a group not among the last keep_last copies its storages as it saves them;
learning steps and int / None budgets copy as before; a step that departs from the
profile falls back, and a group copied early that turns out to be last comes back."""

import pytest
import torch
from torch import nn

from fuseops.offload import planner as planner_module
from fuseops.offload.link import HostLink
from fuseops.offload.planner import Planner
from tests.offload._models import assert_bitwise, mlp_layers, run_step
from tests.offload.test_planner import BYTES_PER_S, MARGIN, FakeTimer, Tick, Timed, auto_step, timed_layers

CPU = torch.device("cpu")
# Per layer: forward and backward seconds (groups start at 0, 4, 8, 12 ms of the forward):
# the link has room for group 2, and the last group's backward for its reload.
TIMES = [[4e-3] * 4, [8e-3] * 3 + [40e-3]]
STARTS = [0.0, 4e-3, 8e-3, 12e-3]


@pytest.fixture
def timer(monkeypatch):
    timer = FakeTimer()
    monkeypatch.setitem(planner_module._planners, CPU, Planner(timer, bytes_per_s=BYTES_PER_S, margin=MARGIN))
    return timer


class Issues:
    """Each copy out's issue time (fake seconds since the step began) and bytes."""

    def __init__(self, monkeypatch, timer) -> None:
        self.timer, self.calls, self.begin = timer, [], 0.0
        original = HostLink.copy_out

        def copy_out(link, sources, after):
            self.calls.append((round(timer.now - self.begin, 9), sum(s.numel() for s in sources)))
            return original(link, sources, after)

        monkeypatch.setattr(HostLink, "copy_out", copy_out)

    def step(self, run):
        self.calls, self.begin = [], self.timer.now
        return run()

    def bytes_at(self) -> dict[float, int]:
        out: dict[float, int] = {}
        for t, n in self.calls:
            out[t] = out.get(t, 0) + n
        return out


def planner() -> Planner:
    return planner_module._planners[CPU]


def test_auto_copies_a_group_as_it_saves_once_the_layout_is_known(timer, monkeypatch):
    layers, x = timed_layers(timer, TIMES, 4), torch.randn(40, 32)
    issues = Issues(monkeypatch, timer)
    # Learning steps move nothing: no copy is issued, early or not.
    for _ in range(2):
        assert issues.step(lambda: auto_step(layers, x, 1))["bytes_offloaded"] == 0
        assert issues.calls == []
    for _ in range(3):
        stats = issues.step(lambda: auto_step(layers, x, 1))
        # Group g's copies are issued as its storages are saved (at its start here: the
        # clock ticks after each layer), not when group g + 1 starts: group 0's at 0.
        by_time = issues.bytes_at()
        planned = {STARTS[g]: n for g, n in planner().planned.items() if n > 0}
        assert by_time == planned and 0.0 in by_time
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == sum(planned.values())


@pytest.mark.parametrize("budget", [None, 20_000])
def test_int_and_none_budgets_copy_a_group_when_the_next_starts(timer, monkeypatch, budget):
    layers, x = timed_layers(timer, TIMES, 4), torch.randn(40, 32)
    issues = Issues(monkeypatch, timer)
    options = {"min_tensor_bytes": 1024, "keep_last": 1, "group_budget_bytes": budget}
    for _ in range(3):
        step = issues.step(lambda: run_step(layers, x, options))
        assert_bitwise(step, run_step(layers, x))
        assert issues.calls and {t for t, _ in issues.calls} <= set(STARTS[1:])
        assert sum(n for _, n in issues.calls) == step.offload.stats["bytes_offloaded"] > 0
    assert timer.marks == 0


class Ticking(nn.Module):
    """Advances the fake clock mid-layer: the storages saved after it are saved later."""

    def __init__(self, timer: FakeTimer, seconds: float) -> None:
        super().__init__()
        self.timer, self.seconds = timer, seconds

    def forward(self, h):
        return Tick.apply(h, self.timer, self.seconds, 0.0)


def test_learning_steps_time_each_storage_save_and_the_plan_counts_copies_from_there(timer):
    # Each layer's norm input and output are saved at its start, the GELU's input and
    # output 1 ms in (after a tick between the first linear and the GELU).
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 96), Ticking(timer, 1e-3), nn.GELU(),
                                         nn.Linear(96, 32)) for _ in range(4))
    layers = nn.ModuleList(Timed(block, timer, [[1e-3] * 4, TIMES[1]], i) for i, block in enumerate(blocks))
    x = torch.randn(40, 32)
    for _ in range(3):
        auto_step(layers, x, 1)
    profile = planner().profile
    # Group 0's input is the leaf (not saved for offload): its norm's output is first.
    assert [len(g) for g in profile.ready] == [len(g) for g in profile.sizes] == [3, 4, 4, 4]
    assert profile.ready[0] == pytest.approx((0.0, 1e-3, 1e-3))
    assert all(r == pytest.approx((0.0, 0.0, 1e-3, 1e-3)) for r in profile.ready[1:])


def test_a_group_copied_early_that_turns_out_to_be_last_comes_back_bitwise(timer, monkeypatch):
    # Profiled with four groups; a step with three: its group 2 matched the profile so far
    # and was not among the profile's last, so it copied early, and is the last here.
    layers, x = timed_layers(timer, TIMES, 4), torch.randn(40, 32)
    three = nn.ModuleList(layers[:3])
    for _ in range(3):
        auto_step(layers, x, 1)
    assert planner().planned.get(2, 0) > 0
    issues = Issues(monkeypatch, timer)
    stats = issues.step(lambda: auto_step(three, x, 1))  # bitwise against no offloading
    # Each group's copies at its own start, group 2's included (kept, it would copy none).
    assert issues.bytes_at() == {STARTS[g]: planner().planned[g] for g in range(3)}
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == sum(issues.bytes_at().values())
    # Then the three-group layout is learned afresh: nothing moves while it learns.
    assert auto_step(three, x, 1)["bytes_offloaded"] == 0


def test_a_changed_group_stops_copies_from_the_next_group_on(timer, monkeypatch):
    # Group 1's hidden width changes: it was planned as it started (its earlier groups
    # matched) and moves only storages of the sizes the plan chose at their places; from
    # group 2 on the step departs from the profile and moves nothing.
    layers, x = timed_layers(timer, TIMES, 4), torch.randn(40, 32)
    for _ in range(3):
        auto_step(layers, x, 1)
    planned = dict(planner().planned)
    assert planned.get(2, 0) > 0
    changed = nn.ModuleList([layers[0], Timed(mlp_layers(n=1, hidden=64, seed=1)[0], timer, TIMES, 1),
                             *layers[2:]])
    issues = Issues(monkeypatch, timer)
    stats = issues.step(lambda: auto_step(changed, x, 1))
    by_time = issues.bytes_at()
    assert set(by_time) <= {STARTS[0], STARTS[1]} and by_time[STARTS[0]] == planned[0]
    assert by_time.get(STARTS[1], 0) <= planned[1]
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == sum(by_time.values())
    assert stats["skipped_learning"] > 0  # groups 2 and 3: the step diverged
