"""Expert-parallel dispatch/combine on 2 and 4 gloo ranks: each rank receives exactly its
experts' rows, grouped by expert; combine undoes dispatch (values and gradients); and a
whole MoE layer (permute, dispatch, GroupedLinear-SwiGLU-GroupedLinear, combine,
unpermute) matches the single-process float64 layer. Both checks also run on NCCL
(tests/distributed/run_nccl.py, and tests/distributed/test_nccl.py on one GPU as well)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import fuseops
import fuseops.distributed
from fuseops import ops
from fuseops.moe.expert_parallel import combine, dispatch
from tests.distributed.launch import Report, run_on_ranks
from tests.helpers import DTYPES

HIDDEN, FFN, TOP_K = 8, 6, 2


def _routing(gen, world, num_experts, *, skew=False):
    """Every rank's token count and expert ids [T, TOP_K] (distinct per token)."""
    out = []
    for s in range(world):
        tokens = 3 + 2 * s
        scores = torch.rand(tokens, num_experts, generator=gen)
        if skew:
            # Only rank 0's experts are chosen: every other rank receives nothing.
            scores[:, num_experts // world :] = -1.0
        out.append(scores.topk(TOP_K, dim=1).indices)
    return out


def _sorted_rows(x, ids):
    """Plain-torch permute: rows (token, k) stably sorted by expert."""
    order = torch.argsort(ids.reshape(-1), stable=True)
    return x[order // TOP_K], ids.reshape(-1)[order]


def check_dispatch_roundtrip(device, dtypes, report: Report):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    for dtype in dtypes:
        for local_experts, skew in ((1, False), (3, False), (2, True)):
            # At least TOP_K experts in all (a token picks TOP_K distinct ones), on one rank too.
            local_experts = max(local_experts, -(-TOP_K // world))
            num_experts = local_experts * world
            gen = torch.Generator().manual_seed(3)
            ids = _routing(gen, world, num_experts, skew=skew)
            xs = [torch.randn(t.shape[0], HIDDEN, generator=gen).to(dtype) for t in ids]
            rows = [_sorted_rows(x, i) for x, i in zip(xs, ids)]

            x_sorted, experts_of_rows = (t.to(device) for t in rows[rank])
            x_sorted = x_sorted.requires_grad_()
            splits = torch.bincount(experts_of_rows, minlength=num_experts)
            x_local, local_splits, handle = dispatch(x_sorted, splits, group)

            mine = range(rank * local_experts, (rank + 1) * local_experts)
            expected = torch.cat([r[0][r[1] == e] for e in mine for r in rows])
            assert torch.equal(x_local.cpu(), expected), "dispatch: rows or their order differ"
            assert local_splits.tolist() == [sum(int((r[1] == e).sum()) for r in rows) for e in mine]

            # A per-expert scale on the expert side, so combine's order shows in the result.
            scale = torch.repeat_interleave(torch.arange(1, local_experts + 1, device=device, dtype=dtype), local_splits)
            y_sorted = combine(x_local * scale[:, None], handle)
            row_scale = (experts_of_rows % local_experts + 1).to(dtype)[:, None]
            assert torch.equal(y_sorted, x_sorted.detach() * row_scale), "combine does not undo dispatch"
            dy = torch.randn(y_sorted.shape, generator=gen).to(device, dtype)
            y_sorted.backward(dy)
            report.close(x_sorted.grad, dy * row_scale, dtype, "dispatch-combine input grad")
    _check_create_graph(device, group)
    _check_errors(device)


def _check_create_graph(device, group):
    # Under create_graph=True the exchange's gradient sits behind the raising node, as every fuseops
    # backward's does (second_backward.py): x's gradient depends on w (the experts' side), and a
    # second backward through it raises, never takes that dependence as zero.
    x = torch.randn(4, 3, device=device, requires_grad=True)
    w = torch.randn(3, device=device, requires_grad=True)
    world = dist.get_world_size()
    x_local, _, handle = dispatch(x, [4] + [0] * (world - 1), group)
    y = combine(x_local * w, handle)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y), create_graph=True)
    assert gx.requires_grad, "the exchange's gradient came back a constant"
    with pytest.raises(RuntimeError, match="double backward"):
        (gx.square().sum() + y.sum()).backward()


def _check_errors(device):
    group, world = dist.group.WORLD, dist.get_world_size()
    x = torch.randn(4, 3, device=device)
    if world > 1:
        with pytest.raises(ValueError, match=rf"split_sizes: expected \[E\] with E .* divisible by the group size {world}, got shape \[{world + 1}\]"):
            dispatch(x, [1] * (world + 1), group)
    # Every rank passes sizes that do not cover its rows, so every rank raises.
    with pytest.raises(ValueError, match="split_sizes: expected non-negative sizes summing to the 4 rows of x_sorted, got sum 0"):
        dispatch(x, [0] * world, group)
    _, _, handle = dispatch(x, [4] + [0] * (world - 1), group)
    with pytest.raises(ValueError, match="y_local: expected the .* rows dispatch delivered to this rank, got shape"):
        combine(torch.randn(sum(handle.recv_splits) + 1, 3, device=device), handle)


def _experts(num_experts, dtype, device):
    return fuseops.Sequential(
        ops.GroupedLinear(num_experts, HIDDEN, 2 * FFN, device=device, dtype=dtype),
        ops.SwiGLU(),
        ops.GroupedLinear(num_experts, FFN, HIDDEN, device=device, dtype=dtype),
    )


def _reference_moe(x, ids, probs, w1, w2):
    """float64: y[t] = sum_k probs[t, k] * W2[e] swiglu(W1[e] x[t]), e = ids[t, k]."""
    h = torch.einsum("tkfh,th->tkf", w1[ids], x)
    a, b = h.chunk(2, -1)
    return torch.einsum("tkhf,tkf,tk->th", w2[ids], F.silu(a) * b, probs)


def check_expert_parallel_moe(device, dtypes, report: Report):
    from fuseops.moe import permute, unpermute

    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    local_experts = 2
    num_experts = local_experts * world
    for dtype in dtypes:
        gen = torch.Generator().manual_seed(5)

        def full(*shape):
            return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).double()

        ids = _routing(gen, world, num_experts)
        xs = [full(t.shape[0], HIDDEN) for t in ids]
        probs = [torch.softmax(full(t.shape[0], TOP_K), -1).to(dtype).double() for t in ids]
        dys = [full(t.shape[0], HIDDEN) for t in ids]
        w1, w2 = full(num_experts, 2 * FFN, HIDDEN) * 0.5, full(num_experts, HIDDEN, FFN) * 0.5

        w1_64, w2_64 = w1.clone().requires_grad_(), w2.clone().requires_grad_()
        x64 = [x.clone().requires_grad_() for x in xs]
        p64 = [p.clone().requires_grad_() for p in probs]
        y64 = [_reference_moe(x, i, p, w1_64, w2_64) for x, i, p in zip(x64, ids, p64)]
        torch.autograd.backward(y64, dys)

        experts = _experts(local_experts, dtype, device)
        full_state = {"0.weight": w1.to(dtype), "2.weight": w2.to(dtype)}
        experts.load_state_dict(fuseops.distributed.shard_state_dict(full_state, experts, expert_group=group))

        x = xs[rank].to(device, dtype).requires_grad_()
        p = probs[rank].to(device, dtype).requires_grad_()
        x_sorted, split_sizes, row_map = permute(x, ids[rank].to(device), num_experts)
        x_local, local_splits, handle = dispatch(x_sorted, split_sizes, group)
        y = unpermute(combine(experts(x_local, local_splits, local_splits), handle), row_map, p)
        y.backward(dys[rank].to(device, dtype))

        mine = slice(rank * local_experts, (rank + 1) * local_experts)
        report.close(y, y64[rank], dtype, "MoE output", 4)
        report.close(x.grad, x64[rank].grad, dtype, "MoE input grad", 4)
        report.close(p.grad, p64[rank].grad, dtype, "MoE router-weight grad", 4)
        report.close(experts[0].weight.grad, w1_64.grad[mine], dtype, "MoE expert fc1 weight grad", 4)
        report.close(experts[2].weight.grad, w2_64.grad[mine], dtype, "MoE expert fc2 weight grad", 4)


@pytest.mark.parametrize("world_size", [2, 4])
def test_dispatch_combine_roundtrip(world_size):
    run_on_ranks(check_dispatch_roundtrip, world_size, DTYPES)


@pytest.mark.parametrize("world_size", [2, 4])
def test_expert_parallel_moe_matches_single_process(world_size):
    run_on_ranks(check_expert_parallel_moe, world_size, DTYPES)
