"""The fixed-capacity expert-parallel exchange (``dispatch(..., capacity=)``, ``dispatch_chunks``)
on 2 and 4 gloo ranks: with enough capacity it delivers the exact exchange's rows (then zero
padding) and the whole MoE layer, exact or at a capacity, in one piece or in chunks, equals the
single-process float64 layer (output and every gradient, weights loaded from a checkpoint saved
at another world size); rows past capacity are counted and contribute zero ("drop") or raise
("error"); a rank with no tokens and experts with no rows work; bad arguments raise ValueError.
The value checks also run on NCCL (tests/distributed/run_nccl.py; tests/distributed/test_nccl.py
on one GPU too); the GPU checks below prove that the capacity path never syncs with the host,
replays in a CUDA graph, and orders its chunks' exchanges with the caller's stream."""

import functools
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import fuseops
from fuseops import ops
from fuseops.moe import (
    combine,
    dispatch,
    dispatch_chunks,
    expert_capacity,
    expert_state_dict_for_rank,
    gather_expert_state_dicts,
    permute,
    unpermute,
)
from tests.distributed.launch import Report, run_on_ranks
from tests.helpers import DTYPES, capture_cuda_graph, reroutable

HIDDEN, FFN, TOP_K = 8, 6, 2
# float64 proves the exchange exact; the narrow dtypes that it moves them untouched.
CPU_DTYPES = (torch.float64, torch.float32, torch.bfloat16)


def _routing(gen, world, num_experts, variant):
    """Every rank's expert ids [T, TOP_K] (distinct per token). "mixed": 3 + 2s tokens on rank
    s; "empty": the last rank has no tokens and every token picks rank 0's experts, so the
    other ranks' experts receive nothing; "skewed": 6 tokens on every rank, half of them (the
    even ones) with expert 0 as their top-1."""
    out = []
    for s in range(world):
        tokens = {"mixed": 3 + 2 * s, "empty": 0 if s == world - 1 else 4, "skewed": 6}[variant]
        scores = torch.rand(tokens, num_experts, generator=gen)
        if variant == "empty":
            scores[:, num_experts // world:] = -1.0
        if variant == "skewed":
            scores[::2, 0] = 2.0
        out.append(scores.topk(TOP_K, dim=1).indices)
    return out


def _pair_rows(ids, num_experts, world):
    """[world, world]: rows rank s sends to rank r."""
    local = num_experts // world
    return torch.stack([torch.bincount(i.reshape(-1) // local, minlength=world) for i in ids])


def _kept(ids, num_experts, world, capacity):
    """[T, TOP_K] bool: whether (t, k)'s row is among the first ``capacity`` its rank sends to
    the expert's rank, in x_sorted order (by expert, then token)."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sorted_pos = torch.empty_like(order)
    sorted_pos[order] = torch.arange(order.numel())
    dest = flat // (num_experts // world)
    dest_start = torch.stack([(dest < d).sum() for d in range(world)])
    return (sorted_pos - dest_start[dest] < capacity).view(ids.shape)


def _experts(local_experts, dtype, device):
    return fuseops.Sequential(
        ops.GroupedLinear(local_experts, HIDDEN, 2 * FFN, bias=True, device=device, dtype=dtype),
        ops.SwiGLU(),
        ops.GroupedLinear(local_experts, FFN, HIDDEN, bias=True, device=device, dtype=dtype),
    )


def _reference_moe(x, ids, probs, w1, b1, w2, b2):
    """float64: y[t] = sum_k probs[t, k] * (W2[e] swiglu(W1[e] x[t] + b1[e]) + b2[e]), e = ids[t, k]."""
    h = torch.einsum("tkfh,th->tkf", w1[ids], x) + b1[ids]
    a, b = h.chunk(2, -1)
    return torch.einsum("tkhf,tkf,tk->th", w2[ids], F.silu(a) * b, probs) + torch.einsum("tkh,tk->th", b2[ids], probs)


def _moe_step(experts, x, ids, probs, dy, num_experts, group, mode):
    """permute, the exchange of ``mode`` (dispatch's / dispatch_chunks' keywords), experts,
    combine, unpermute, backward; returns (y, handle)."""
    x_sorted, split_sizes, row_map = permute(x, ids, num_experts)
    if "chunks" in mode:
        arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, **mode)
        y_local = [experts(x_k, s_k, s_k) for x_k, s_k in arrived]
    else:
        x_local, local_splits, handle = dispatch(x_sorted, split_sizes, group, **mode)
        y_local = experts(x_local, local_splits, local_splits)
    y = unpermute(combine(y_local, handle), row_map, probs)
    y.backward(dy)
    return y, handle


def _check_layer(device, dtype, report, variant, capacity_of, modes, drop=False):
    """The EP layer under each of ``modes`` against the float64 layer; with ``drop``, the
    reference without the rows past ``capacity_of(pair_rows)`` (the modes must drop them)."""
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    local_experts = 2
    num_experts = local_experts * world
    gen = torch.Generator().manual_seed(5)

    def full(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).double()

    ids = _routing(gen, world, num_experts, variant)
    capacity = capacity_of(_pair_rows(ids, num_experts, world))
    xs = [full(t.shape[0], HIDDEN) for t in ids]
    probs = [torch.softmax(full(t.shape[0], TOP_K), -1).to(dtype).double() for t in ids]
    dys = [full(t.shape[0], HIDDEN) for t in ids]
    w = {"0.weight": full(num_experts, 2 * FFN, HIDDEN) * 0.5, "0.bias": full(num_experts, 2 * FFN) * 0.5,
         "2.weight": full(num_experts, HIDDEN, FFN) * 0.5, "2.bias": full(num_experts, HIDDEN) * 0.5}
    keep = [_kept(i, num_experts, world, capacity) if drop else torch.ones_like(i, dtype=torch.bool) for i in ids]

    # Every rank's tokens, as the experts' weight gradients sum over all of them.
    w64 = {k: v.clone().requires_grad_() for k, v in w.items()}
    x64 = [x.clone().requires_grad_() for x in xs]
    p64 = [p.clone().requires_grad_() for p in probs]
    y64 = [_reference_moe(x, i, p * k, w64["0.weight"], w64["0.bias"], w64["2.weight"], w64["2.bias"])
           for x, i, p, k in zip(x64, ids, p64, keep)]
    torch.autograd.backward(y64, dys)

    # Weights from a checkpoint saved at another world size.
    saved_at = 4 if world == 2 else 2
    shards = [expert_state_dict_for_rank({k: v.to(dtype) for k, v in w.items()}, r, saved_at) for r in range(saved_at)]
    experts = _experts(local_experts, dtype, device)
    experts.load_state_dict(expert_state_dict_for_rank(gather_expert_state_dicts(shards), rank, world))

    mine = slice(rank * local_experts, (rank + 1) * local_experts)
    for mode in modes:
        mode = {k: capacity if v == "C" else v for k, v in mode.items()}
        what = f"{variant} {mode}"
        experts.zero_grad(set_to_none=True)
        x = xs[rank].to(device, dtype).clone().requires_grad_()
        p = probs[rank].to(device, dtype).clone().requires_grad_()
        y, handle = _moe_step(experts, x, ids[rank].to(device), p, dys[rank].to(device, dtype), num_experts, group,
                              mode)
        if "capacity" in mode:
            assert handle.dropped.item() == int((~keep[rank]).sum()), f"{what}: dropped {handle.dropped.item()}"
        report.close(y, y64[rank], dtype, f"MoE output, {what}", 4)
        report.close(x.grad, x64[rank].grad, dtype, f"MoE input grad, {what}", 4)
        report.close(p.grad, p64[rank].grad, dtype, f"MoE router-weight grad, {what}", 4)
        for name, param in experts.named_parameters():
            report.close(param.grad, w64[name].grad[mine], dtype, f"MoE expert {name} grad, {what}", 4)


def check_capacity_moe(device, dtypes, report: Report):
    """Enough capacity (one slot spare, so there is padding, and a slot per chunk): every
    exchange is exact."""
    modes = ({}, {"capacity": "C"}, {"capacity": "C", "chunks": 2})
    for dtype in dtypes:
        for variant in ("mixed", "empty"):
            _check_layer(device, dtype, report, variant, lambda pairs: max(int(pairs.max()) + 1, 2), modes)


def check_capacity_drop(device, dtypes, report: Report):
    """Capacity one row short of the busiest pair: those rows are dropped ("drop": counted,
    zero in the output) or raise ("error", on CPU where the assert raises at once)."""
    modes = ({"capacity": "C", "on_overflow": "drop"}, {"capacity": "C", "chunks": 2, "on_overflow": "drop"})
    for dtype in dtypes:
        _check_layer(device, dtype, report, "mixed", lambda pairs: int(pairs.max()) - 1, modes, drop=True)
    if device.type != "cpu":
        # On CUDA the assert fires on the device and poisons the process's CUDA context.
        return
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    num_experts = 2 * world
    ids = _routing(torch.Generator().manual_seed(5), world, num_experts, "mixed")
    pairs = _pair_rows(ids, num_experts, world)
    capacity = int(pairs.max()) - 1
    x_sorted, split_sizes, _ = permute(torch.randn(ids[rank].shape[0], HIDDEN), ids[rank], num_experts)
    if pairs[rank].max() > capacity:
        with pytest.raises(RuntimeError, match=rf"than capacity={capacity} \(row slots per source->destination"):
            dispatch(x_sorted, split_sizes, group, capacity=capacity)
    else:
        # A rank within capacity is not held up by one that overflows.
        next(dispatch_chunks(x_sorted, split_sizes, group, capacity=capacity, chunks=1)[0])


def check_capacity_roundtrip(device, dtypes, report: Report):
    """x_local holds the exact exchange's rows, then zeros; combine undoes dispatch in every
    chunking (a per-expert scale on the expert side shows the grouping), and so do the gradients."""
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    for dtype in dtypes:
        for local_experts, variant, chunks in ((1, "mixed", 1), (3, "mixed", 2), (2, "empty", 3)):
            # At least TOP_K experts in all (a token picks TOP_K distinct ones), on one rank too.
            local_experts = max(local_experts, -(-TOP_K // world))
            num_experts = local_experts * world
            gen = torch.Generator().manual_seed(3)
            ids = _routing(gen, world, num_experts, variant)
            # At least a slot per chunk (on one rank, "empty" has no rows at all).
            capacity = max(int(_pair_rows(ids, num_experts, world).max()) + 2, chunks)
            x = torch.randn(ids[rank].shape[0], HIDDEN, generator=gen).to(device, dtype)
            x_sorted, split_sizes, _ = permute(x, ids[rank].to(device), num_experts)
            x_sorted = x_sorted.detach().requires_grad_()

            exact, exact_splits, _ = dispatch(x_sorted.detach(), split_sizes, group)
            x_local, local_splits, handle = dispatch(x_sorted.detach(), split_sizes, group, capacity=capacity)
            rows = exact.shape[0]
            assert x_local.shape[0] == world * capacity
            assert torch.equal(x_local[:rows], exact), "capacity dispatch: rows or their order differ"
            assert not x_local[rows:].any(), "capacity dispatch: padding rows are not zero"
            assert handle.expert_rows.tolist() == exact_splits.tolist()
            assert local_splits.tolist() == exact_splits.tolist()[:-1] + [exact_splits[-1].item() + x_local.shape[0] - rows]
            assert handle.dropped.item() == 0

            arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, capacity=capacity, chunks=chunks)
            y_chunks = []
            for (lo, hi), (x_k, splits_k) in zip(handle.windows, arrived):
                assert x_k.shape[0] == world * (hi - lo) and int(splits_k.sum()) == x_k.shape[0]
                scale = torch.repeat_interleave(torch.arange(1, local_experts + 1, device=device, dtype=dtype), splits_k)
                y_chunks.append(x_k * scale[:, None])
            y_sorted = combine(y_chunks, handle)
            experts_of_rows = torch.repeat_interleave(torch.arange(num_experts, device=device), split_sizes)
            row_scale = (experts_of_rows % local_experts + 1).to(dtype)[:, None]
            assert torch.equal(y_sorted, x_sorted.detach() * row_scale), f"combine does not undo {chunks} chunk(s)"
            dy = torch.randn(y_sorted.shape, generator=gen).to(device, dtype)
            y_sorted.backward(dy)
            report.close(x_sorted.grad, dy * row_scale, dtype, f"capacity dispatch-combine input grad, {chunks} chunks")
            if chunks > 1:
                _check_chunk_without_gradient(x_sorted, split_sizes, capacity, chunks, dy)
                _check_chunks_from_a_generator(x_sorted, split_sizes, capacity, chunks, dy, local_experts)


def _check_chunks_from_a_generator(x_sorted, split_sizes, capacity, chunks, dy, local_experts):
    """combine takes the chunks' outputs from a generator (each chunk's return exchange starting
    as it comes, while the experts run on the next): the same output and gradient as a list."""
    group = dist.group.WORLD
    results = []
    for lazy in (False, True):
        x_sorted.grad = None
        arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, capacity=capacity, chunks=chunks)

        def expert(x_k, splits_k):
            scale = torch.repeat_interleave(torch.arange(1, local_experts + 1, device=x_k.device, dtype=x_k.dtype),
                                            splits_k)
            return x_k * scale[:, None]
        outputs = (expert(x_k, s_k) for x_k, s_k in arrived)
        y = combine(outputs if lazy else list(outputs), handle)
        y.backward(dy)
        results.append((y.detach(), x_sorted.grad.clone()))
    assert torch.equal(results[0][0], results[1][0]), "combine of a generator: outputs differ from a list's"
    assert torch.equal(results[0][1], results[1][1]), "combine of a generator: gradients differ from a list's"


def _check_chunk_without_gradient(x_sorted, split_sizes, capacity, chunks, dy):
    """A chunk whose output does not depend on its rows (no gradient reaches its arrival) still
    takes part in the backward's exchanges: the gradient equals that of the chunk's rows times
    zero, and no rank waits on a collective another skipped."""
    group = dist.group.WORLD
    grads = []
    for detached in (True, False):
        x_sorted.grad = None
        arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, capacity=capacity, chunks=chunks)
        ys = [(x_k.detach() if detached and k == 0 else x_k) * (0 if k == 0 else 1)
              for k, (x_k, _) in enumerate(arrived)]
        combine(ys, handle).backward(dy)
        grads.append(x_sorted.grad.clone())
    assert torch.equal(grads[0], grads[1]), "a chunk without gradient changes the others' gradients"


def check_capacity_errors(device, dtypes, report: Report):
    group, world = dist.group.WORLD, dist.get_world_size()
    x = torch.randn(4, 3, device=device)
    splits = [4] + [0] * (2 * world - 1)
    for capacity in (0, -2):
        with pytest.raises(ValueError, match=rf"capacity: expected an int >= 1 .*, got {capacity}"):
            dispatch(x, splits, group, capacity=capacity)
    with pytest.raises(TypeError, match=r"capacity: expected an int >= 1 .*, got float 2.0"):
        dispatch(x, splits, group, capacity=2.0)
    with pytest.raises(ValueError, match=r"on_overflow: 'drop' applies to a capacity exchange"):
        dispatch(x, splits, group, on_overflow="drop")
    if device.type == "cpu":
        # On CUDA the assert fires on the device and poisons the process's CUDA context.
        with pytest.raises(RuntimeError, match=r"split_sizes: expected non-negative sizes summing to the 4 rows"):
            dispatch(x, [5, -1] + [0] * (2 * world - 2), group, capacity=4)
    with pytest.raises(ValueError, match=r"on_overflow: expected one of \['error', 'drop'\], got 'skip'"):
        dispatch(x, splits, group, capacity=4, on_overflow="skip")
    for chunks in (0, 5):
        with pytest.raises(ValueError, match=rf"chunks: expected an int in \[1, capacity=4\], got {chunks}"):
            dispatch_chunks(x, splits, group, capacity=4, chunks=chunks)

    arrived, handle = dispatch_chunks(x, splits, group, capacity=4, chunks=2)
    y_chunks = [x_k for x_k, _ in arrived]
    rows = [world * 2, world * 2]
    with pytest.raises(ValueError, match=rf"y_local: expected 2 chunk\(s\) of {re.escape(str(rows))} rows .*, got \[\[{world * 2}, 3\]\]"):
        combine(y_chunks[0], handle)
    with pytest.raises(ValueError, match=r"y_local: expected 2 chunk\(s\) of .* got \[\[.*\], \[1, 3\]\]"):
        combine([y_chunks[0], y_chunks[1][:1]], handle)
    combine(y_chunks, handle)
    # From a generator, each chunk is checked as it comes, before its exchange starts.
    arrived, handle = dispatch_chunks(x, splits, group, capacity=4, chunks=2)
    with pytest.raises(ValueError, match=rf"y_local: expected chunk 0 of {world * 2} rows .*, got \[1, 3\]"):
        combine((x_k[:1] for x_k, _ in arrived), handle)
    arrived, handle = dispatch_chunks(x, splits, group, capacity=4, chunks=2)
    with pytest.raises(ValueError, match=r"handle: expected chunk 0 of its dispatch_chunks iterator read before"):
        combine(iter([x.new_zeros(world * 2, 3)]), handle)
    with pytest.raises(TypeError, match=r"y_local: expected a tensor, a sequence or an iterator of chunk outputs, got int"):
        combine(3, handle)
    _check_unread_chunks(x, splits, group)

    # Under create_graph=True the exchange's gradient sits behind the raising node (second_backward.py).
    x = x.requires_grad_()
    w = torch.randn(3, device=device, requires_grad=True)
    x_local, _, handle = dispatch(x, splits, group, capacity=4)
    y = combine(x_local * w, handle)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y), create_graph=True)
    assert gx.requires_grad, "the exchange's gradient came back a constant"
    with pytest.raises(RuntimeError, match="double backward"):
        (gx.square().sum() + y.sum()).backward()


def _check_unread_chunks(x, splits, group):
    """combine refuses a dispatch_chunks handle whose iterator was not read to the end (outputs
    of the right shapes, but a chunk never waited for), on the host, before any collective: only
    rank 0 makes the mistake, and the ranks' collectives still pair up afterwards."""
    world, rank = dist.get_world_size(), dist.get_rank()
    arrived, handle = dispatch_chunks(x, splits, group, capacity=4, chunks=2)
    stand_in = x.new_zeros(world * 2, 3)
    if rank == 0:
        with pytest.raises(ValueError, match=r"handle: expected all 2 chunks of its dispatch_chunks iterator "
                                             r"read \(in order, .*\) before combine, got 0 read"):
            combine([stand_in, stand_in], handle)
    first, _ = next(arrived)
    if rank == 0:
        with pytest.raises(ValueError, match=r"handle: expected all 2 chunks .* got 1 read"):
            combine([first, stand_in], handle)
    second, _ = next(arrived)
    assert next(arrived, None) is None
    assert torch.equal(combine([first, second], handle), x)

    # dispatch reads its one chunk itself.
    x_local, _, handle = dispatch(x, splits, group, capacity=4)
    assert handle.arrived == [0]
    assert torch.equal(combine(x_local, handle), x)


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("check", [check_capacity_roundtrip, check_capacity_moe, check_capacity_drop,
                                   check_capacity_errors], ids=lambda c: c.__name__.removeprefix("check_capacity_"))
def test_capacity_exchange(check, world_size):
    run_on_ranks(check, world_size, CPU_DTYPES)


def test_expert_capacity():
    assert expert_capacity(10, 2, 4) == 5
    assert expert_capacity(10, 2, 4, capacity_factor=1.25) == 7
    assert expert_capacity(10, 2, 4, capacity_factor=4) == 20
    assert expert_capacity(0, 2, 4) == 1
    for kwargs, name in (({"tokens": -1}, "tokens"), ({"top_k": 0}, "top_k"), ({"world_size": 0}, "world_size")):
        args = {"tokens": 10, "top_k": 2, "world_size": 4} | kwargs
        with pytest.raises(ValueError, match=rf"{name}: expected an int >= ., got {kwargs[name]}"):
            expert_capacity(**args)
    with pytest.raises(ValueError, match=r"capacity_factor: expected a finite number > 0, got 0.0"):
        expert_capacity(10, 2, 4, capacity_factor=0.0)
    with pytest.raises(TypeError, match=r"top_k: expected an int >= 1, got float 2.0"):
        expert_capacity(10, 2.0, 4)


# On GPUs: NCCL (one rank per GPU, or one GPU alone), float32, routing that every replay changes.
GPU_TOKENS, GPU_LOCAL_EXPERTS = 256, 4


def _gpu_layer(device):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    num_experts = GPU_LOCAL_EXPERTS * world
    torch.manual_seed(rank)
    experts = _experts(GPU_LOCAL_EXPERTS, torch.float32, device)
    x = torch.randn(GPU_TOKENS, HIDDEN, device=device, requires_grad=True)
    dy = torch.randn(GPU_TOKENS, HIDDEN, device=device)
    ids, weights, route = reroutable(GPU_TOKENS, num_experts, TOP_K, device)
    # Never drops (a factor of world would not either), and leaves padding rows.
    capacity = expert_capacity(GPU_TOKENS, TOP_K, world, capacity_factor=world + 1)
    leaves = [x, weights, *experts.parameters()]

    def step(chunks: int) -> torch.Tensor:
        for t in leaves:
            t.grad = None
        mode = {"capacity": capacity, "chunks": chunks} if chunks > 1 else {"capacity": capacity}
        return _moe_step(experts, x, ids, weights, dy, num_experts, group, mode)[0]

    # Each rank routes its own tokens.
    return step, (lambda seed: route(seed * 101 + rank)), leaves


def check_capacity_no_host_sync(device, dtypes, report: Report):
    step, route, _ = _gpu_layer(device)
    route(0)
    for chunks in (1, 2):
        step(chunks)  # warm-up: Triton compiles, the NCCL communicator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for chunks in (1, 2):
            step(chunks)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def check_capacity_cuda_graph(device, dtypes, report: Report):
    """A captured EP step (forward and backward), replayed after new routing is copied in,
    equals the eager step on that routing bit for bit."""
    step, route, leaves = _gpu_layer(device)
    for chunks in (1, 2):
        route(1)
        ref = [step(chunks).detach()] + [t.grad.clone() for t in leaves]
        route(2)
        graph, y_static = capture_cuda_graph(functools.partial(step, chunks), error_mode="thread_local")
        route(1)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip([y_static] + [t.grad for t in leaves], ref, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def check_capacity_chunks_on_a_side_stream(device, dtypes, report: Report):
    """dispatch_chunks called on a side stream, its input written there late (behind a spin
    kernel, over NaN): the host enqueues the exchange, the chunks' reads, combine and backward
    without waiting for the device (no host sync; the input is still unwritten when it is
    done); the all-to-alls run after the write (NCCL's stream waits for the side stream) and
    each chunk is read after its exchange. The chunks equal those of the same call on the
    default stream, and combine's output and the gradient are the exact ones, bit for bit."""
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    num_experts, chunks = GPU_LOCAL_EXPERTS * world, 3
    gen = torch.Generator().manual_seed(11 + rank)
    ids = torch.rand(GPU_TOKENS, num_experts, generator=gen).topk(TOP_K, dim=1).indices.to(device)
    source, split_sizes, _ = permute(torch.randn(GPU_TOKENS, HIDDEN, generator=gen).to(device), ids, num_experts)
    dy = torch.randn(source.shape, generator=gen).to(device)
    capacity = expert_capacity(GPU_TOKENS, TOP_K, world, capacity_factor=world + 1)
    expert_scale = torch.arange(1, GPU_LOCAL_EXPERTS + 1, device=device, dtype=torch.float32)

    def exchange(x):
        arrived, handle = dispatch_chunks(x, split_sizes, group, capacity=capacity, chunks=chunks)
        x_chunks, y_chunks = [], []
        for x_k, splits_k in arrived:
            # output_size: repeat_interleave need not read the device split sizes on the host.
            scale = torch.repeat_interleave(expert_scale, splits_k, output_size=x_k.shape[0])
            x_chunks.append(x_k.detach())
            y_chunks.append(x_k * scale[:, None])
        y = combine(y_chunks, handle)
        y.backward(dy)
        return x_chunks, y.detach()

    # On the default stream: the reference, and the warm-up (communicator, kernels).
    x_ref = source.clone().requires_grad_()
    want_chunks, want_y = exchange(x_ref)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            x = torch.full_like(source, float("nan"))
            # About half a second: the host is done with everything below long before.
            torch.cuda._sleep(1_000_000_000)
            x.copy_(source)
            written = torch.cuda.Event()
            written.record()
            got_chunks, got_y = exchange(x.requires_grad_())
            host_ran_ahead = not written.query()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert host_ran_ahead, "the host waited for the device before the input was written"
    for k, (got, want) in enumerate(zip(got_chunks, want_chunks, strict=True)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"chunk {k} differs from the default stream's")
    experts_of_rows = torch.repeat_interleave(torch.arange(num_experts, device=device), split_sizes)
    row_scale = (experts_of_rows % GPU_LOCAL_EXPERTS + 1).float()[:, None]
    for got, want in ((want_y, source * row_scale), (got_y, source * row_scale), (x_ref.grad, dy * row_scale),
                      (x.grad, dy * row_scale)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


GPU_CHECKS = (check_capacity_no_host_sync, check_capacity_cuda_graph, check_capacity_chunks_on_a_side_stream)


@pytest.mark.gpu
@pytest.mark.parametrize("check", GPU_CHECKS, ids=lambda c: c.__name__)
def test_capacity_exchange_on_two_gpus(check):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    run_on_ranks(check, 2, DTYPES, device_type="cuda")
