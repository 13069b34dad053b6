"""The exact exchange in pieces (``dispatch_chunks`` without ``capacity``) on 2 and 4 gloo ranks:
the rows a rank routes to its own experts come first, as a view of ``x_sorted`` (no exchange);
the remote rows follow in pieces, each grouped by local expert; together the pieces hold exactly
the rows ``dispatch`` delivers; ``combine`` of the pieces' outputs (a list or a generator) undoes
the dispatch, and so do the gradients, also when a piece gets no gradient; the whole MoE layer
(uniform, skewed: half the tokens' top-1 on one expert, or with a rank without tokens) equals the
single-process float64 layer, output and every gradient. The value checks also run on NCCL
(tests/distributed/run_nccl.py); the GPU checks below prove that after the one count read
nothing syncs with the host."""

import pytest
import torch
import torch.distributed as dist

from fuseops.moe import ExactChunksHandle, combine, dispatch, dispatch_chunks, permute, unpermute
from tests.distributed.launch import Report, run_on_ranks
from tests.helpers import DTYPES, reroutable
from tests.moe.test_expert_parallel_capacity import (
    CPU_DTYPES,
    GPU_LOCAL_EXPERTS,
    GPU_TOKENS,
    HIDDEN,
    TOP_K,
    _check_layer,
    _experts,
    _routing,
)


def _rows(device, dtype, variant, local_experts, seed=3):
    """This rank's sorted rows, each carrying a unique id in column 0 (rank * 32 + row: exact in bfloat16), and
    their split sizes."""
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    num_experts = local_experts * world
    gen = torch.Generator().manual_seed(seed)
    ids = _routing(gen, world, num_experts, variant)[rank].to(device)
    x = torch.randn(ids.shape[0], HIDDEN, generator=gen).to(device, dtype)
    x_sorted, split_sizes, _ = permute(x, ids, num_experts)
    x_sorted = x_sorted.detach().clone()
    x_sorted[:, 0] = rank * 32 + torch.arange(x_sorted.shape[0], device=device)
    return x_sorted.requires_grad_(), split_sizes, group, num_experts


def _expert_scale(x_k, splits_k, local_experts):
    """Each row times its local expert's number (1, 2, ...): combine's output shows the grouping."""
    scale = torch.arange(1, local_experts + 1, device=x_k.device, dtype=x_k.dtype)
    return x_k * torch.repeat_interleave(scale, splits_k, output_size=x_k.shape[0])[:, None]


def check_pieces_roundtrip(device, dtypes, report: Report):
    world, rank = dist.get_world_size(), dist.get_rank()
    for dtype in dtypes:
        for local_experts, variant, chunks in ((1, "mixed", 1), (3, "mixed", 2), (2, "empty", 3), (2, "skewed", 2)):
            local_experts = max(local_experts, -(-TOP_K // world))
            x_sorted, split_sizes, group, num_experts = _rows(device, dtype, variant, local_experts)
            exact, exact_splits, _ = dispatch(x_sorted.detach(), split_sizes, group)

            arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, chunks=chunks)
            assert isinstance(handle, ExactChunksHandle) and len(handle.pieces) == chunks
            pieces = list(arrived)
            assert len(pieces) == chunks + 1
            own, own_splits = pieces[0]
            a, b = handle.own
            assert own.data_ptr() == x_sorted[a:b].data_ptr() and own.shape[0] == b - a, "own rows: not a view"
            assert own_splits.tolist() == split_sizes[rank * local_experts:(rank + 1) * local_experts].tolist()
            # Each piece grouped by local expert: its rows of expert e are rows of e in dispatch's x_local.
            total = torch.zeros(local_experts, dtype=torch.int64)
            for x_k, splits_k in pieces:
                assert int(splits_k.sum()) == x_k.shape[0]
                for e, rows_e in enumerate(x_k.detach().split(splits_k.tolist())):
                    lo = int(exact_splits[:e].sum())
                    want = exact[lo:lo + int(exact_splits[e])]
                    assert torch.isin(rows_e[:, 0], want[:, 0]).all(), f"piece rows not of local expert {e}"
                total += splits_k.cpu()
            assert total.tolist() == exact_splits.tolist(), "the pieces do not hold dispatch's rows"
            ids = torch.cat([x_k[:, 0].detach() for x_k, _ in pieces])
            assert ids.unique().numel() == ids.numel() == exact.shape[0], "a row arrived twice or never"

            experts_of_rows = torch.repeat_interleave(torch.arange(num_experts, device=device), split_sizes)
            row_scale = (experts_of_rows % local_experts + 1).to(dtype)[:, None]
            y = combine([_expert_scale(x_k, s_k, local_experts) for x_k, s_k in pieces], handle)
            assert torch.equal(y, x_sorted.detach() * row_scale), f"combine does not undo {chunks} piece(s)"
            gen = torch.Generator().manual_seed(7 + rank)
            dy = torch.randn(y.shape, generator=gen).to(device, dtype)
            y.backward(dy)
            report.close(x_sorted.grad, dy * row_scale, dtype, f"exact pieces dispatch-combine input grad, {chunks}")
            _check_generator_and_no_gradient(x_sorted, split_sizes, chunks, dy, local_experts)
    _check_errors(device)


def _check_generator_and_no_gradient(x_sorted, split_sizes, chunks, dy, local_experts):
    """combine takes the pieces' outputs from a generator (each piece's return starting as it
    comes): the same output and gradient as from a list. A piece whose output does not depend on
    its rows (no gradient reaches its arrival) still takes part in the backward's exchanges:
    its rows' gradient is zero, the others' unchanged."""
    group = dist.group.WORLD
    results = []
    for lazy, detach in ((False, None), (True, None), (False, 1)):
        x_sorted.grad = None
        arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, chunks=chunks)
        outputs = ((_expert_scale(x_k.detach() if k == detach else x_k, s_k, local_experts))
                   for k, (x_k, s_k) in enumerate(arrived))
        y = combine(outputs if lazy else list(outputs), handle)
        y.backward(dy)
        results.append((y.detach(), x_sorted.grad.clone(), handle))
    assert torch.equal(results[0][0], results[1][0]), "combine of a generator: outputs differ from a list's"
    assert torch.equal(results[0][1], results[1][1]), "combine of a generator: gradients differ from a list's"
    handle = results[2][2]
    want = results[0][1].clone()
    # Piece 1 (the first remote piece) got no gradient: the rows this rank sent in it get zero.
    for a, b in handle.pieces[0].send:
        want[a:b] = 0
    assert torch.equal(results[2][1], want), "a piece without gradient changes the others' gradients"


def _check_errors(device):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    x = torch.randn(4, 3, device=device)
    splits = [4] + [0] * (2 * world - 1)
    with pytest.raises(ValueError, match=r"chunks: expected an int >= 1, got 0"):
        dispatch_chunks(x, splits, group, chunks=0)
    with pytest.raises(TypeError, match=r"chunks: expected an int >= 1, got str '2'"):
        dispatch_chunks(x, splits, group, chunks="2")
    with pytest.raises(ValueError, match=r"on_overflow: 'drop' applies to a capacity exchange"):
        dispatch_chunks(x, splits, group, chunks=2, on_overflow="drop")
    # Every rank passes sizes that do not cover its rows, so every rank raises.
    with pytest.raises(ValueError, match="split_sizes: expected non-negative sizes summing to the 4 rows"):
        dispatch_chunks(x, [0] * (2 * world), group, chunks=2)
    arrived, handle = dispatch_chunks(x, splits, group, chunks=1)
    first, _ = next(arrived)
    # Checked on the host before any collective, alike on every rank.
    with pytest.raises(ValueError, match=r"handle: expected all 2 chunks .* got 1 read"):
        combine([first, first[:0]], handle)
    second, _ = next(arrived)
    with pytest.raises(ValueError, match=r"y_local: expected 2 chunk\(s\) of \[\d+, \d+\] rows"):
        combine([first, second, second], handle)
    y = combine([first, second], handle)
    assert torch.equal(y, x)


def check_pieces_moe(device, dtypes, report: Report):
    """The whole layer, exact in one piece or in pieces, against the float64 layer."""
    modes = ({}, {"chunks": 1}, {"chunks": 2}, {"chunks": 3})
    for dtype in dtypes:
        for variant in ("mixed", "empty", "skewed"):
            _check_layer(device, dtype, report, variant, lambda pairs: 1, modes)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("check", [check_pieces_roundtrip, check_pieces_moe],
                         ids=lambda c: c.__name__.removeprefix("check_"))
def test_exact_pieces(check, world_size):
    run_on_ranks(check, world_size, CPU_DTYPES)


def check_exact_no_host_sync_after_the_count_read(device, dtypes, report: Report):
    """After ``dispatch`` / ``dispatch_chunks`` return (their one host read of the counts), the
    experts, ``combine`` and the backward, in one piece or in pieces, never sync with the host."""
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    num_experts = GPU_LOCAL_EXPERTS * world
    torch.manual_seed(rank)
    experts = _experts(GPU_LOCAL_EXPERTS, torch.float32, device)
    x = torch.randn(GPU_TOKENS, HIDDEN, device=device, requires_grad=True)
    dy = torch.randn(GPU_TOKENS, HIDDEN, device=device)
    ids, weights, route = reroutable(GPU_TOKENS, num_experts, TOP_K, device)
    route(rank)
    for chunks in (None, 1, 2, 2):
        x_sorted, split_sizes, row_map = permute(x, ids, num_experts)
        if chunks is None:
            x_local, splits, handle = dispatch(x_sorted, split_sizes, group)
        else:
            arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, chunks=chunks)
        torch.cuda.set_sync_debug_mode("error")
        try:
            if chunks is None:
                y_local = experts(x_local, splits, splits)
            else:
                y_local = (experts(x_k, s_k, s_k) for x_k, s_k in arrived)
            y = combine(y_local, handle)
            unpermute(y, row_map, weights).backward(dy)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


GPU_CHECKS = (check_exact_no_host_sync_after_the_count_read,)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=lambda c: c.__name__)
def test_exact_pieces_on_two_gpus(check):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    run_on_ranks(check, 2, DTYPES, device_type="cuda")

