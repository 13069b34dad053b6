"""AllGather / ReduceScatter / AllReduce on 2 and 4 gloo ranks against single-process
float64 maths (outputs and input gradients), inside plans with other ops, and their
errors. ``check_comm_ops`` also runs on NCCL (tests/distributed/run_nccl.py)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import fuseops
from fuseops import ops
from tests.distributed.launch import Report, run_on_ranks
from tests.helpers import DTYPES


def _per_rank(gen, world, *shape):
    """One float64 tensor per rank, the same on every rank (shared seed)."""
    return [torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(world)]


def _run(op_or_ops, x, dy):
    model = fuseops.Sequential(*op_or_ops) if isinstance(op_or_ops, list) else fuseops.Sequential(op_or_ops)
    y = model(x)
    y.backward(dy)
    return y, x.grad, model


def check_comm_ops(device, dtypes, report: Report):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    for dtype in dtypes:
        gen = torch.Generator().manual_seed(7)

        def local(t):
            return t.to(device, dtype).requires_grad_()

        # The reference sees the inputs rounded to dtype, so only the collectives'
        # own rounding (sums in dtype) is measured.
        xs = [t.to(dtype).double() for t in _per_rank(gen, world, 3, 5, 2)]
        dys = [t.to(dtype).double() for t in _per_rank(gen, world, 3 * world, 5, 2)]
        y, dx, _ = _run(ops.AllGather(group), local(xs[rank]), dys[rank].to(device, dtype))
        report.close(y, torch.cat(xs), dtype, "AllGather output")
        report.close(dx, sum(d[3 * rank : 3 * rank + 3] for d in dys), dtype, "AllGather input grad", 4)

        xs = [t.to(dtype).double() for t in _per_rank(gen, world, 2 * world, 5)]
        dys = [t.to(dtype).double() for t in _per_rank(gen, world, 2, 5)]
        y, dx, _ = _run(ops.ReduceScatter(group), local(xs[rank]), dys[rank].to(device, dtype))
        report.close(y, sum(xs)[2 * rank : 2 * rank + 2], dtype, "ReduceScatter output", 4)
        report.close(dx, torch.cat(dys), dtype, "ReduceScatter input grad")

        # What follows an AllReduce runs on every rank alike: the same dy everywhere.
        xs = [t.to(dtype).double() for t in _per_rank(gen, world, 4, 3)]
        dy = torch.randn(4, 3, generator=gen, dtype=torch.float64).to(dtype).double()
        y, dx, _ = _run(ops.AllReduce(group), local(xs[rank]), dy.to(device, dtype))
        report.close(y, sum(xs), dtype, "AllReduce output", 4)
        report.close(dx, dy, dtype, "AllReduce input grad")

        _check_in_a_plan(device, dtype, gen, report)
    _check_errors(device)


def _check_in_a_plan(device, dtype, gen, report):
    """AllGather -> Linear + GELU (fused, replicated weights) -> ReduceScatter."""
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    linear = ops.Linear(6, 4, device=device, dtype=dtype)
    w = torch.randn(4, 6, generator=gen, dtype=torch.float64).to(dtype)
    b = torch.randn(4, generator=gen, dtype=torch.float64).to(dtype)
    with torch.no_grad():
        linear.weight.copy_(w)
        linear.bias.copy_(b)
    xs = [t.to(dtype).double() for t in _per_rank(gen, world, 2, 6)]
    dys = [t.to(dtype).double() for t in _per_rank(gen, world, 2, 4)]
    chain = [ops.AllGather(group), linear, ops.GELU(approximate="tanh"), ops.ReduceScatter(group)]
    x = xs[rank].to(device, dtype).requires_grad_()
    y, dx, model = _run(chain, x, dys[rank].to(device, dtype))
    assert ("ForwardLinearBiasActivation", (1, 2)) in model.plan.forward

    x64 = torch.cat(xs).requires_grad_()
    # Every rank computes the same f(x_all); the reduce-scatter sums P copies.
    y64 = world * F.gelu(F.linear(x64, w.double(), b.double()), approximate="tanh")
    y64.backward(torch.cat(dys))
    report.close(y, y64[2 * rank : 2 * rank + 2], dtype, "AllGather-Linear-GELU-ReduceScatter output", 4)
    report.close(dx, x64.grad[2 * rank : 2 * rank + 2], dtype, "AllGather-Linear-GELU-ReduceScatter input grad", 4)


def _check_errors(device):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    with pytest.raises(ValueError, match=rf"ReduceScatter input: expected the first dim divisible by the group size {world}, got shape \[{world + 1}, 3\]"):
        fuseops.Sequential(ops.ReduceScatter(group))(torch.randn(world + 1, 3, device=device))
    with pytest.raises(ValueError, match="AllGather input: .* 0-d"):
        fuseops.Sequential(ops.AllGather(group))(torch.tensor(1.0, device=device))
    # A group this rank is not in (dist.new_group must be called on every rank).
    only_rank0 = dist.new_group([0])
    if rank != 0:
        with pytest.raises(ValueError, match="group: this rank is not a member"):
            ops.AllGather(only_rank0)


@pytest.mark.parametrize("world_size", [2, 4])
def test_comm_ops_match_single_process(world_size):
    run_on_ranks(check_comm_ops, world_size, DTYPES)


@pytest.mark.parametrize("group", [None, "world", 0])
def test_group_must_be_a_process_group(group):
    with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup"):
        ops.AllReduce(group)
