"""offload_activations end to end on CPU: bit-for-bit gradients, exact byte accounting."""

import pytest
import torch

from fuseops.offload import host_arena, offload_activations
from tests.offload._models import assert_bitwise, fuseops_layers, mlp_layers, run_step

CONFIGS = [
    dict(min_tensor_bytes=1024),
    dict(min_tensor_bytes=1024, keep_last=0),
    dict(min_tensor_bytes=1024, keep_last=2),
    dict(min_tensor_bytes=1024, group_budget_bytes=20_000),
    dict(min_tensor_bytes=0, keep_last=0),
]


def saved_storages_by_group(layers, x, *, with_counts=False):
    """A reference count of what the scheduler should move: per layer, the distinct
    storages autograd saves that are neither parameters nor the leaf input, in save
    order (their sizes; ``with_counts``: (size, tensors saved from it) pairs)."""
    per_group, current, alive = [], None, []

    def pack(t):
        base = t if t._base is None else t._base
        if not isinstance(base, torch.nn.Parameter) and not (base.is_leaf and base.requires_grad):
            n, count = current.get(t.untyped_storage()._cdata, (t.untyped_storage().nbytes(), 0))
            current[t.untyped_storage()._cdata] = (n, count + 1)
            alive.append(t)
        return t

    x = x.detach().requires_grad_()
    h = x
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for layer in layers:
            current = {}
            per_group.append(current)
            h = h + layer(h)
    return [list(g.values()) if with_counts else [n for n, _ in g.values()] for g in per_group]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_torch_stack_is_bitwise_and_accounted(config, dtype):
    layers = mlp_layers(dtype=dtype)
    x = torch.randn(40, 32, dtype=dtype)
    want = run_step(layers, x)
    got = run_step(layers, x, config)
    assert_bitwise(got, want)
    stats = got.offload.stats
    assert stats["bytes_offloaded"] > 0
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"]
    assert stats["groups"] == len(layers)


def test_bytes_offloaded_match_an_independent_count():
    layers, x = mlp_layers(n=5), torch.randn(40, 32)
    groups = saved_storages_by_group(layers, x)
    floor = 4096
    big = [[n for n in g if n >= floor] for g in groups]
    small = sum(len(g) for g in groups) - sum(len(g) for g in big)
    # keep_last=2: the first three of five groups move.
    stats = run_step(layers, x, dict(min_tensor_bytes=floor, keep_last=2)).offload.stats
    assert stats["bytes_offloaded"] == sum(sum(g) for g in big[:3])
    assert stats["storages_offloaded"] == stats["tensors_offloaded"] == sum(len(g) for g in big[:3])
    assert stats["skipped_kept"] == sum(len(g) for g in big[3:])
    assert stats["skipped_small"] == small
    # Per layer the norm's weight and bias, two Linear weights (saved transposed); and
    # the leaf input.
    assert stats["skipped_parameter"] == 4 * len(layers)
    assert stats["skipped_leaf"] == 1
    assert stats["tensors_skipped"] == sum(v for k, v in stats.items() if k.startswith("skipped_"))


def test_group_budget_keeps_what_does_not_fit():
    layers, x = mlp_layers(n=3), torch.randn(40, 32)
    groups = saved_storages_by_group(layers, x, with_counts=True)
    budget = 16_000
    moved = moved_tensors = over_budget = 0
    # The last group stays (keep_last=1); in the others, storages in save order, each
    # moving while it fits in what the budget has left.
    for storages in groups[:-1]:
        left = budget
        for n, tensors in storages:
            if n <= left:
                left -= n
                moved, moved_tensors = moved + n, moved_tensors + tensors
            else:
                over_budget += tensors
    assert 0 < moved and over_budget > 0 and moved_tensors > 0
    step = run_step(layers, x, dict(min_tensor_bytes=0, group_budget_bytes=budget))
    assert_bitwise(step, run_step(layers, x))
    stats = step.offload.stats
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == moved
    assert stats["tensors_offloaded"] == moved_tensors
    assert stats["skipped_budget"] == over_budget
    assert stats["skipped_kept"] == sum(tensors for _, tensors in groups[-1])


def test_a_zero_budget_moves_nothing_and_is_bitwise():
    layers, x = mlp_layers(n=3), torch.randn(40, 32)
    groups = saved_storages_by_group(layers, x, with_counts=True)
    step = run_step(layers, x, dict(min_tensor_bytes=0, keep_last=0, group_budget_bytes=0))
    assert_bitwise(step, run_step(layers, x))
    stats = step.offload.stats
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == stats["tensors_offloaded"] == 0
    assert stats["skipped_budget"] == sum(tensors for g in groups for _, tensors in g)


def test_fuseops_sequential_calls_are_groups_and_bitwise():
    layers, x = fuseops_layers(), torch.randn(24, 32)
    want = run_step(layers, x)
    got = run_step(layers, x, dict(min_tensor_bytes=1024), groups=False)
    assert_bitwise(got, want)
    stats = got.offload.stats
    assert stats["groups"] == len(layers)
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] > 0
    # Parameters reach save_for_backward (for its version check) and are skipped, never copied.
    assert 0 < stats["skipped_parameter"] <= sum(1 for layer in layers for _ in layer.parameters())


def test_grouped_mlp_is_bitwise():
    import fuseops
    from fuseops import ops

    torch.manual_seed(0)
    experts = fuseops.Sequential(ops.GroupedLinear(3, 16, 48), ops.SwiGLU(), ops.GroupedLinear(3, 24, 16))
    x = torch.randn(30, 16)
    splits = [11, 0, 19]

    def step(offload):
        for p in experts.parameters():
            p.grad = None
        xr = x.clone().requires_grad_()
        with offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None) if offload else torch.enable_grad() as handle:
            y = experts(xr, splits, splits)
        y.square().sum().backward()
        return [y.detach(), xr.grad] + [p.grad for p in experts.parameters()], handle

    want, _ = step(False)
    got, handle = step(True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert handle.stats["bytes_offloaded"] == handle.stats["bytes_reloaded"] > 0


def test_nested_disabled_block_keeps_its_tensors():
    layers, x = mlp_layers(n=3), torch.randn(40, 32)
    want = run_step(layers, x)
    xr = x.clone().requires_grad_()
    with offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None) as outer:
        h = xr
        with outer.group():
            h = h + layers[0](h)
        with offload_activations(enabled=False) as inner:
            with inner.group():
                h = h + layers[1](h)
        with outer.group():
            h = h + layers[2](h)
    for p in layers.parameters():
        p.grad = None
    h.float().square().mean().backward()
    assert torch.equal(h, want.tensors[0]) and torch.equal(xr.grad, want.tensors[1])
    saved_in_layer = len(saved_storages_by_group(layers, x)[1]) + 4  # + the four parameters
    assert inner.stats["skipped_disabled"] == inner.stats["tensors_skipped"] == saved_in_layer
    assert inner.stats["bytes_offloaded"] == 0
    assert outer.stats["groups"] == 2
    assert outer.stats["bytes_offloaded"] == outer.stats["bytes_reloaded"] > 0


def test_without_groups_everything_is_one_group():
    layers, x = mlp_layers(n=3), torch.randn(40, 32)
    kept = run_step(layers, x, dict(min_tensor_bytes=0), groups=False).offload.stats
    assert kept["groups"] == 1 and kept["bytes_offloaded"] == 0 and kept["skipped_kept"] > 0
    moved = run_step(layers, x, dict(min_tensor_bytes=0, keep_last=0), groups=False)
    assert_bitwise(moved, run_step(layers, x))
    assert moved.offload.stats["bytes_offloaded"] > 0


def test_no_host_memory_leaks_and_second_step_allocates_none():
    arena = host_arena("cpu")
    layers, x = mlp_layers(n=4), torch.randn(40, 32)
    lent = arena.lent_bytes
    run_step(layers, x, dict(min_tensor_bytes=1024))
    assert arena.lent_bytes == lent
    allocations, reserved = arena.allocations, arena.reserved_bytes
    for _ in range(2):
        run_step(layers, x, dict(min_tensor_bytes=1024))
    assert (arena.allocations, arena.reserved_bytes) == (allocations, reserved)
    assert arena.lent_bytes == lent


def test_blocks_come_back_when_the_graph_is_dropped_without_backward():
    arena = host_arena("cpu")
    layers, x = mlp_layers(n=3), torch.randn(40, 32, requires_grad=True)
    lent = arena.lent_bytes
    with offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None) as handle:
        h = x
        for layer in layers:
            with handle.group():
                h = layer(h)
    assert handle.stats["bytes_offloaded"] > 0 and arena.lent_bytes > lent
    del h
    assert arena.lent_bytes == lent


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(keep_last=-1), "keep_last: expected an int >= 0, got -1"),
        (dict(min_tensor_bytes=1.5), "min_tensor_bytes: expected an int >= 0, got 1.5"),
        (dict(group_budget_bytes=-2), 'group_budget_bytes: expected "auto", None or an int >= 0, got -2'),
        (dict(group_budget_bytes="fast"), 'group_budget_bytes: expected "auto", None or an int >= 0, got \'fast\''),
        (dict(peak_bytes_target=0), "peak_bytes_target: expected None or an int > 0, got 0"),
        (dict(link_bytes_per_s=-1.0), "link_bytes_per_s: expected None or a finite number > 0, got -1.0"),
    ],
)
def test_arguments_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        with offload_activations(**kwargs):
            pass


@pytest.mark.parametrize("budget, shown", [(1.5e6, r"1500000\.0 \(float\)"), (True, r"True \(bool\)")])
def test_a_budget_of_another_type_is_a_type_error(budget, shown):
    with pytest.raises(TypeError, match=f'group_budget_bytes: expected "auto", None or an int >= 0, got {shown}'):
        with offload_activations(group_budget_bytes=budget):
            pass


def test_offloading_leaves_the_plan_fused():
    # Offloading groups by global module hooks; they must not turn the ops into fusion
    # boundaries (only an op's own hooks do).
    import fuseops
    from fuseops import ops

    model = fuseops.Sequential(ops.Linear(32, 64), ops.GELU(), ops.Linear(64, 32))
    x = torch.randn(8, 32, requires_grad=True)
    model(x)
    plain = model.plan.forward
    with fuseops.offload_activations(min_tensor_bytes=0, group_budget_bytes=None):
        model(x)
    assert model.plan.forward == plain and len(plain) < 3


def test_auto_stats_say_what_was_planned_and_from_what():
    """``group_budget_bytes="auto"``: from the first step, every group but the kept one gets
    an allowance at the stated rates the stats give, and nothing moves beyond it."""
    from fuseops.offload.estimate import FLOPS_PER_S, LINK_BYTES_PER_S

    layers = mlp_layers(n=4, width=64, hidden=256)
    x = torch.randn(512, 64)
    stats = run_step(layers, x, dict(group_budget_bytes="auto", min_tensor_bytes=0)).offload.stats
    assert stats["groups_planned"] == 3 and stats["bytes_offloaded"] <= stats["planned_bytes"], stats
    assert stats["planned_bytes_per_s"] == LINK_BYTES_PER_S["cpu"] and stats["planned_flops_per_s"] == FLOPS_PER_S["cpu"]
