"""The step's plan alone (queue_plan.py, choice.py): whole storages chosen over the whole
queue, against exhaustive search; caps that bound every group; sums that stay exact."""

import functools
import itertools
import random

import pytest

from fuseops.offload import choice
from fuseops.offload.choice import fullest_subset, subset_sums
from fuseops.offload.queue_plan import Profile, copy_limit, plan_step

MiB = 2**20


def all_sums(sizes, cap):
    return {sum(c) for r in range(len(sizes) + 1) for c in itertools.combinations(sizes, r) if sum(c) <= cap}


@pytest.mark.parametrize("seed", range(20))
def test_the_fullest_subset_is_the_largest_sum_under_the_cap(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([64, 128, 176, 192, 256]) * MiB for _ in range(rng.randint(0, 7))]
    cap = rng.randint(0, sum(sizes) + 1)
    assert set(subset_sums(sizes, cap)) == all_sums(sizes, cap)
    chosen = fullest_subset(tuple(sizes), cap)
    assert list(chosen) == sorted(set(chosen))
    assert sum(sizes[i] for i in chosen) == max(all_sums(sizes, cap))


def test_many_unrelated_sizes_keep_few_sums_each_exact():
    rng = random.Random(0)
    sizes = tuple(rng.randint(1, 10**6) for _ in range(24))
    sums = subset_sums(sizes, sum(sizes))
    assert len(sums) <= 2 * choice.MAX_SUMS and sums[0] == 0 and sums[-1] == sum(sizes)
    for s in sums[:: len(sums) // 8]:
        # Each sum kept is one the storages really make: the subset for it fills it.
        assert sum(sizes[i] for i in fullest_subset(sizes, s)) == s
    # What thinning lost here: under a step of the largest sum.
    cap = sum(sizes) // 2
    best = sum(sizes[i] for i in fullest_subset(sizes, cap))
    assert cap - sum(sizes) / choice.MAX_SUMS <= best <= cap


def profile(forward_ms, backward_ms, sizes_mib, keep_last=1, first_reload=()):
    sizes = tuple(tuple(int(n * MiB) for n in group) for group in sizes_mib)
    return Profile(tuple(map(sum, sizes)), keep_last, tuple(t / 1e3 for t in forward_ms),
                   (None,) + tuple(t / 1e3 for t in backward_ms[1:]), 3, first_reload, sizes)


def exhaustive(p, keep_last, rate, prior=None):
    """The most bytes of any choice of subsets that keeps the queue within ``copy_limit``
    at every group (with keep_last=0 a group moves what save order lets under its cap),
    each cap at most ``prior``'s: every choice tried, the rest of the step searched once
    per (group, link free) reached."""
    n, prior = len(p.layout), prior or {}
    options = []
    for sizes in p.sizes[: n - keep_last]:
        caps = all_sums(sizes, sum(sizes))
        options.append({(c, sum_in_save_order(sizes, c) if keep_last == 0 else c) for c in caps})

    @functools.cache
    def most(g, free):
        if g == n - keep_last:
            return 0
        start, limit = copy_limit(p, g, keep_last, free, rate)
        limit = min(limit, prior.get(g, limit))
        return max(moves + most(g + 1, start + moves / rate if moves else free)
                   for cap, moves in options[g] if cap <= limit)

    return most(0, 0.0)


def sum_in_save_order(sizes, cap):
    moved = 0
    for n in sizes:
        if n <= cap - moved:
            moved += n
    return moved


def per_group_budget(p, keep_last, rate):
    """The rule the plan replaced: each group in turn fills the window the queue left it."""
    free, total = 0.0, 0
    for g in range(len(p.layout) - keep_last):
        start, limit = copy_limit(p, g, keep_last, free, rate)
        moves = max(all_sums(p.sizes[g], limit))
        free, total = (start + moves / rate if moves else free), total + moves
    return total


# The H100 MoE stack's groups (64, 128, 176 and 128 MiB storages and the router's 0.25),
# at its 51.2 GB/s: timings fitted to the per-group budgets the H100 benchmark printed.
MOE = {"forward_ms": [2.1] * 7 + [1.9], "backward_ms": [4.29] * 8,
       "sizes_mib": [(0.25, 128, 176, 128)] + [(64, 0.25, 128, 176, 128)] * 7, "first_reload": ((6, 0.21e-3),)}


def test_the_h100_moe_step_moves_whole_storages_the_budgets_left_unused():
    # Per group the budgets moved 176, 64, 128, 64, 128, 64 MiB (the H100's log: three
    # groups planned just under 128 MiB); the plan with copies issued at group
    # keep_last's start moved 176, 64, 64, 176, 64, 128 (672 MiB). Issued as each group
    # saves them (early.py; no save times here: each storage counted ready at its
    # group's start), the link also works through group 0's forward.
    p, rate = profile(**MOE), 51.2e9 * 0.95
    plan = plan_step(p, 1, rate, {})
    assert [round(m / MiB) for m in plan.moves] == [176, 176, 0, 176, 64, 176, 0]
    assert per_group_budget(p, 1, rate) < sum(plan.moves) == exhaustive(p, 1, rate)
    assert sum(plan.moves) > 672 * MiB
    assert plan.caps == plan.moves
    assert plan.before == tuple(sum(plan.moves[:g]) for g in range(len(plan.moves)))


@pytest.mark.parametrize("keep_last", [0, 1, 2])
@pytest.mark.parametrize("seed", range(12))
def test_the_plan_moves_what_exhaustive_search_finds(seed, keep_last):
    rng = random.Random(seed)
    n = 5
    forward = [rng.uniform(1.0, 4.0) for _ in range(n)]
    backward = [rng.uniform(2.0, 9.0) for _ in range(n)]
    sizes = [rng.sample([64, 64, 128, 176, 256], rng.randint(1, 4)) for _ in range(n)]
    p, rate = profile(forward, backward, sizes, keep_last), rng.uniform(30e9, 60e9)
    plan = plan_step(p, keep_last, rate, {})
    assert sum(plan.moves) == exhaustive(p, keep_last, rate) >= per_group_budget(p, keep_last, rate) * (keep_last > 0)
    # Each group's cap lets the scheduler move what the plan counted (keep_last=0: save order).
    for g, (cap, moves) in enumerate(zip(plan.caps, plan.moves)):
        got = sum_in_save_order(p.sizes[g], cap) if keep_last == 0 else max(all_sums(p.sizes[g], cap))
        assert got == moves


@pytest.mark.parametrize("seed", range(6))
def test_caps_bound_every_group_and_a_plan_under_its_own_caps_is_itself(seed):
    rng = random.Random(seed)
    p, rate = profile(**MOE), rng.uniform(40e9, 56e9)
    free = plan_step(p, 1, rate, {})
    prior = {g: max(all_sums(p.sizes[g], rng.randint(0, 300) * MiB)) for g in range(len(free.caps))}
    capped = plan_step(p, 1, rate, prior)
    assert all(capped.caps[g] <= prior[g] for g in prior)
    assert sum(capped.moves) == exhaustive(p, 1, rate, prior)
    assert plan_step(p, 1, rate, dict(enumerate(free.caps))) == free


def test_unknown_sizes_plan_bytes_as_the_windows_hold_them():
    p = profile([2.0] * 4, [4.0] * 4, [(64, 128)] * 4)
    p = Profile(p.layout, 1, p.forward, p.backward, 3)
    rate = 50e9
    plan = plan_step(p, 1, rate, {})
    free = 0.0
    for g, cap in enumerate(plan.caps):
        start, limit = copy_limit(p, g, 1, free, rate)
        assert cap == plan.moves[g] == limit
        free = start + cap / rate if cap else free


def exhaustive_timed(p, keep_last, rate):
    """As ``exhaustive`` (keep_last >= 1), each storage's copy queued from its save
    (``Profile.ready``) and the group's copies due by group g + keep_last + 2's start."""
    n = len(p.layout)
    starts = [sum(p.forward[:i]) for i in range(n + 1)]

    @functools.cache
    def most(g, free):
        if g == n - keep_last:
            return 0
        _, limit = copy_limit(p, g, keep_last, free, rate)
        best = 0
        for s in all_sums(p.sizes[g], limit):
            end = free
            for i in fullest_subset(p.sizes[g], s):
                end = max(end, starts[g] + p.ready[g][i]) + p.sizes[g][i] / rate
            if s == 0:
                best = max(best, most(g + 1, free))
            elif end <= starts[min(g + keep_last + 2, n)]:
                best = max(best, s + most(g + 1, end))
        return best

    return most(0, 0.0)


@pytest.mark.parametrize("seed", range(12))
def test_storages_are_counted_from_their_save_as_exhaustive_search_finds(seed):
    # Copies issued as a group saves (early.py): each storage's copy starts no earlier
    # than its save, measured in learning steps.
    rng = random.Random(seed)
    n = 5
    forward = [rng.uniform(1.0, 4.0) for _ in range(n)]
    backward = [rng.uniform(2.0, 9.0) for _ in range(n)]
    sizes = [rng.sample([64, 64, 128, 176, 256], rng.randint(1, 4)) for _ in range(n)]
    p, rate = profile(forward, backward, sizes), rng.uniform(30e9, 60e9)
    ready = tuple(tuple(sorted(rng.uniform(0.0, f / 1e3) for _ in g)) for f, g in zip(forward, sizes))
    timed = Profile(p.layout, 1, p.forward, p.backward, 3, (), p.sizes, ready)
    plan = plan_step(timed, 1, rate, {})
    assert sum(plan.moves) == exhaustive_timed(timed, 1, rate) <= sum(plan_step(p, 1, rate, {}).moves)


def test_a_storage_saved_at_its_groups_end_is_not_planned_from_its_start():
    # Group 0 saves a 64 MiB storage as it starts and a 256 MiB one as it ends (2 ms in);
    # its copies are due at group 3's start (6 ms, the forward's end here). At 50 GB/s the
    # 256 MiB copy takes 5.4 ms: from the group's start it would fit, from its save not.
    p = profile([2.0, 2.0, 2.0], [4.0, 40.0, 40.0], [(64, 256), (1,), (1,)])
    rate = 50e9
    at_start = plan_step(Profile(p.layout, 1, p.forward, p.backward, 3, (), p.sizes, ((0.0, 0.0), (0.0,), (0.0,))),
                         1, rate, {})
    at_save = plan_step(Profile(p.layout, 1, p.forward, p.backward, 3, (), p.sizes, ((0.0, 2e-3), (0.0,), (0.0,))),
                        1, rate, {})
    assert at_start.moves[0] == 256 * MiB and at_save.moves[0] == 64 * MiB
