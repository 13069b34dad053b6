"""Expert parallelism: send each token row to the rank that owns its expert, and back.

E experts are split evenly over the P ranks of a process group: rank r owns experts
``[r * E/P, (r + 1) * E/P)``. On every rank::

    x_sorted, split_sizes, row_map = fuseops.moe.permute(x, expert_ids, E)
    x_local, local_splits, handle = dispatch(x_sorted, split_sizes, group)
    y_local = experts(x_local, local_splits, local_splits)    # GroupedLinear(E/P, ...) ...
    y_sorted = combine(y_local, handle)
    y = fuseops.moe.unpermute(y_sorted, row_map, weights)

The exact exchange (the default) sends rank r's experts' rows (a contiguous block, since
``permute`` grouped them by expert) with one variable-size ``all_to_all_single`` and
reorders what arrives expert-major; ``combine`` is its inverse, and each one's backward is
the other's forward. The split sizes of a variable-size all-to-all are host ints, so it
reads the exchanged per-expert counts on the host once per ``dispatch`` (2E ints).

``dispatch(..., capacity=C)`` reads nothing on the host (``capacity_exchange.py``): each
source→destination pair gets C row slots, the buffers have fixed sizes, and a step captures
in a CUDA graph. ``x_local`` then has P * C rows: the rows received, expert-major, then zero
padding that the last local expert's split size covers (its outputs are discarded and its
gradients are zero). Rows past C fail a device assert (``on_overflow="error"``) or are
dropped (``"drop"``: they contribute zero, and ``handle.dropped`` counts them).
``dispatch_chunks`` is the same exchange cut into chunks whose all-to-alls are all in flight
at once, yielded as they arrive so that the experts run on one while the next travels. It is
a second function because it returns an iterator of chunks where ``dispatch`` returns rows;
``combine`` takes either, with the handle that made them.

``expert_state_dict_for_rank`` and ``gather_expert_state_dicts`` move expert weights between
world sizes (a checkpoint saved on W ranks, loaded on W').
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fuseops.kernels.autodiff_state import batched_cotangents, refuse_batched_cotangents
from fuseops.moe import capacity_exchange as cx
from fuseops.moe.capacity_exchange import CapacityHandle, Overflow
from fuseops.ops.executor.second_backward import once_differentiable
from fuseops.ops.parallel import tensor_parallel as tp


@dataclass(frozen=True)
class DispatchHandle:
    """What ``combine`` (and both backwards) need to undo an exact ``dispatch``."""

    group: dist.ProcessGroup
    # Rows this rank sends to / receives from each rank (host ints, length P).
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    # x_local = received[to_expert_major]; received = x_local[to_source_major]
    # (None when there is one local expert: both orders are the same).
    to_expert_major: torch.Tensor | None
    to_source_major: torch.Tensor | None


def dispatch(
    x_sorted: torch.Tensor,
    split_sizes: torch.Tensor | Sequence[int],
    group: dist.ProcessGroup,
    *,
    capacity: int | None = None,
    on_overflow: str | Overflow = "error",
) -> tuple[torch.Tensor, torch.Tensor, DispatchHandle | CapacityHandle]:
    """Send each row to the rank that owns its expert.

    Args:
        x_sorted: [N, ...] rows grouped by expert (``fuseops.moe.permute``'s output).
        split_sizes: [E] rows per expert (device tensor, CPU tensor or list of ints),
            summing to N; E must divide by the group size P. With ``capacity``, a device
            tensor (``permute``'s) keeps the call free of host syncs; a wrong sum fails a
            device assert there.
        group: the expert-parallel process group.
        capacity: ``None`` (the default): the exact exchange, which reads the counts on the
            host once. An int C >= 1: the fixed-capacity exchange, no host read; C row slots
            per source→destination pair (``expert_capacity`` computes one), the same on
            every rank.
        on_overflow: with ``capacity``, what happens to a rank's rows for one destination
            past the first C (in ``x_sorted`` order, so the destination's last experts and
            last tokens lose rows first): ``"error"`` fails a device assert
            (``RuntimeError``; on CUDA at the next synchronising call, and the CUDA context
            is lost), ``"drop"`` sends zero for them (they add nothing to ``combine``'s
            output) and counts them in ``handle.dropped``.
    Returns:
        ``(x_local, local_splits, handle)``: x_local the rows for this rank's E/P experts,
        grouped by local expert (within an expert, by source rank, each source's rows in
        their order); local_splits [E/P] int64 on x's device, ready for ``GroupedLinear``;
        ``handle`` for ``combine``. Exact: x_local [M, ...], M the rows received. With
        ``capacity``: x_local [P * C, ...], the M rows received followed by P * C - M zero
        rows that ``local_splits[-1]`` includes (``handle.expert_rows`` holds the counts
        without them).
    """
    overflow = Overflow.parse(on_overflow)
    if capacity is None and overflow is not Overflow.ERROR:
        raise ValueError(f"on_overflow: {on_overflow!r} applies to a capacity exchange; the exact exchange "
                         "(capacity=None) never overflows: pass capacity= or leave on_overflow as 'error'")
    counts = _expert_counts(x_sorted, split_sizes, group)
    if capacity is not None:
        chunks, handle = _dispatch_capacity(x_sorted, counts, group, capacity, 1, overflow)
        x_local, local_splits = next(chunks)
        return x_local, local_splits, handle
    world = dist.get_world_size(group)
    local_experts = counts.shape[0] // world
    # recv_counts[s * E/P + e]: rows rank s sends to this rank's local expert e.
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    # The one host sync (see the module docstring).
    host = torch.cat([counts, recv_counts]).tolist()
    sent, received = host[: len(host) // 2], host[len(host) // 2 :]
    if sum(sent) != x_sorted.shape[0]:
        raise ValueError(
            f"split_sizes: expected sizes summing to the {x_sorted.shape[0]} rows of x_sorted, got sum {sum(sent)}"
        )
    send_splits = tuple(sum(sent[r * local_experts : (r + 1) * local_experts]) for r in range(world))
    recv_splits = tuple(sum(received[s * local_experts : (s + 1) * local_experts]) for s in range(world))
    to_expert_major, to_source_major = _reorder(received, world, local_experts, x_sorted.device)
    handle = DispatchHandle(group, send_splits, recv_splits, to_expert_major, to_source_major)
    local_splits = recv_counts.view(world, local_experts).sum(0)
    return _Exchange.apply(x_sorted, handle, True), local_splits, handle


def dispatch_chunks(
    x_sorted: torch.Tensor,
    split_sizes: torch.Tensor | Sequence[int],
    group: dist.ProcessGroup,
    *,
    capacity: int,
    chunks: int,
    on_overflow: str | Overflow = "error",
) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], CapacityHandle]:
    """``dispatch(..., capacity=)`` in ``chunks`` pieces, every piece's all-to-all issued
    (``async_op=True``) before the first is waited for, so that the experts can run on the
    chunks that arrived while the rest travel::

        arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, capacity=C, chunks=2)
        y_sorted = combine((experts(x_k, splits_k, splits_k) for x_k, splits_k in arrived), handle)

    ``combine`` given a generator starts each chunk's return exchange as the chunk's output
    comes, so it travels while the experts run on the next chunk (a list starts them together).

    Chunk k carries slot positions [lo_k, hi_k) of every source→destination pair
    (``handle.windows``: C split as evenly as possible). Every chunk must be read, in order,
    before ``combine`` (which raises ValueError otherwise: a chunk not read was never waited
    for). In the backward each chunk's input gradient starts home as soon as the experts'
    backward on the chunk is done, while the experts' backward runs on the chunks before it;
    with a generator, each chunk's output gradient too is waited for only where its chunk's
    backward needs it.

    Args:
        x_sorted, split_sizes, group, on_overflow: as for ``dispatch``.
        capacity: C >= 1 row slots per source→destination pair (the same on every rank).
        chunks: K, 1 <= K <= C (the same on every rank).
    Returns:
        ``(arrived, handle)``: ``arrived`` yields K pairs ``(x_k, splits_k)``, x_k
        [P * (hi_k - lo_k), ...] that chunk's rows, grouped by local expert then zero
        padding, and splits_k [E/P] int64 on x's device (the last one covering the padding);
        ``handle`` for ``combine``.
    """
    overflow = Overflow.parse(on_overflow)
    counts = _expert_counts(x_sorted, split_sizes, group)
    return _dispatch_capacity(x_sorted, counts, group, capacity, chunks, overflow)


def combine(y_local: torch.Tensor | Sequence[torch.Tensor], handle: DispatchHandle | CapacityHandle) -> torch.Tensor:
    """Send the expert outputs back where ``dispatch`` took their rows from.

    Args:
        y_local: [M, ...] rows in ``dispatch``'s x_local order (the trailing dims may
            differ from x_sorted's); for a ``dispatch_chunks`` handle, the K chunks' outputs
            in order: a sequence (a single tensor for one chunk), or an iterator, whose chunks'
            return exchanges start as they come (overlapping the experts on the next chunk).
        handle: the ``dispatch`` or ``dispatch_chunks`` that produced the rows; every chunk
            of a ``dispatch_chunks`` iterator must have been read (from an iterator of outputs:
            each chunk before its output comes).
    Returns:
        y_sorted [N, ...] in x_sorted's row order (ready for ``fuseops.moe.unpermute``);
        rows the capacity exchange dropped are zero.
    Raises:
        ValueError: ``y_local`` does not have the rows (or chunks) dispatch delivered, or a
            chunk of ``dispatch_chunks`` was not read; checked on the host from the handle
            before any collective starts (from an iterator: each chunk before its exchange
            starts, so an error at a later chunk leaves the other ranks waiting in its
            collective until the process group's timeout).
        TypeError: ``y_local`` is neither a tensor, a sequence nor an iterator.
    """
    if isinstance(handle, CapacityHandle):
        chunks, check = _capacity_chunks(y_local, handle)
        return cx.combine_capacity(chunks, handle, check)
    if not isinstance(handle, DispatchHandle):
        raise TypeError(f"handle: expected what dispatch or dispatch_chunks returned, got {type(handle).__name__}")
    if not isinstance(y_local, torch.Tensor) or y_local.dim() == 0 or y_local.shape[0] != sum(handle.recv_splits):
        got = list(y_local.shape) if isinstance(y_local, torch.Tensor) else type(y_local).__name__
        raise ValueError(
            f"y_local: expected the {sum(handle.recv_splits)} rows dispatch delivered to this rank, got shape {got}"
        )
    return _Exchange.apply(y_local, handle, False)


def expert_capacity(tokens: int, top_k: int, world_size: int, capacity_factor: float = 1.0) -> int:
    """Row slots per source→destination pair for ``dispatch(..., capacity=)``:
    ``ceil(tokens * top_k * capacity_factor / world_size)``, at least 1.

    Balanced routing sends ``tokens * top_k / world_size`` rows from each rank to each rank;
    ``capacity_factor`` is the headroom over that. ``capacity_factor=world_size`` never drops
    (all of a rank's rows may go to one rank).

    Args:
        tokens: T >= 0, tokens per rank (the largest over the ranks if they differ).
        top_k: K >= 1, experts per token.
        world_size: P >= 1, ranks of the expert-parallel group.
        capacity_factor: > 0.
    """
    for name, value, least in (("tokens", tokens, 0), ("top_k", top_k, 1), ("world_size", world_size, 1)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name}: expected an int >= {least}, got {type(value).__name__} {value!r}")
        if value < least:
            raise ValueError(f"{name}: expected an int >= {least}, got {value!r}")
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)):
        raise TypeError(f"capacity_factor: expected a finite number > 0, got {type(capacity_factor).__name__}")
    if not 0 < capacity_factor < math.inf:
        raise ValueError(f"capacity_factor: expected a finite number > 0, got {capacity_factor!r}")
    return max(1, math.ceil(tokens * top_k * capacity_factor / world_size))


def expert_state_dict_for_rank(
    full_state: Mapping[str, torch.Tensor], rank: int, world_size: int, *, expert_keys: Collection[str] | None = None
) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s part of a full expert state dict on ``world_size`` ranks: experts
    ``[rank * E/W, (rank + 1) * E/W)`` of every expert tensor, the other entries whole.

    With ``gather_expert_state_dicts`` it moves a checkpoint between world sizes::

        full = gather_expert_state_dicts(shards_saved_on_W_ranks)
        experts.load_state_dict(expert_state_dict_for_rank(full, rank, W2))

    Args:
        full_state: the unsharded state dict; an expert tensor is [E, ...] (dim 0 the
            experts, as ``GroupedLinear``'s weight and bias), all with the same E.
        rank: 0 <= rank < world_size.
        world_size: W >= 1, dividing E.
        expert_keys: the keys of the expert tensors; ``None``: every entry (the state dict
            of an experts ``fuseops.Sequential``).
    Returns:
        A new dict; the expert entries are views of ``full_state``'s tensors. (From a model
        and its process group, ``fuseops.distributed.shard_state_dict(..., expert_group=)``
        slices the same way.)
    """
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank: expected an int in [0, {world_size}), got {rank!r}")
    keys = _expert_keys(full_state, expert_keys, "full_state")
    num_experts = _num_experts(full_state, keys, "full_state")
    if num_experts is not None and num_experts % world_size != 0:
        raise ValueError(
            f"world_size: expected a divisor of the {num_experts} experts of full_state, got {world_size}"
        )
    out = dict(full_state)
    for key in keys:
        size = full_state[key].shape[0] // world_size
        out[key] = full_state[key].narrow(0, rank * size, size)
    return out


def gather_expert_state_dicts(
    shards: Sequence[Mapping[str, torch.Tensor]], *, expert_keys: Collection[str] | None = None
) -> dict[str, torch.Tensor]:
    """The full state dict from the W ranks' expert-parallel state dicts (the inverse of
    ``expert_state_dict_for_rank``): expert tensors concatenated along dim 0 in rank order,
    the other entries from rank 0's.

    Args:
        shards: W >= 1 state dicts, rank 0 first, with the same keys and shapes.
        expert_keys: the keys of the expert tensors ([E/W, ...] in each shard); ``None``:
            every entry.
    """
    if not isinstance(shards, Sequence) or len(shards) == 0:
        raise ValueError(f"shards: expected a non-empty sequence of state dicts (rank 0 first), got {shards!r}")
    keys = _expert_keys(shards[0], expert_keys, "shards[0]")
    _num_experts(shards[0], keys, "shards[0]")
    for r, shard in enumerate(shards[1:], 1):
        if set(shard) != set(shards[0]):
            raise ValueError(
                f"shards[{r}]: expected the keys of shards[0], got {sorted(set(shard) ^ set(shards[0]))} in only one"
            )
        for key in keys:
            if shard[key].shape != shards[0][key].shape:
                raise ValueError(
                    f"shards[{r}][{key!r}]: expected shards[0]'s shape {list(shards[0][key].shape)}, "
                    f"got {list(shard[key].shape)}"
                )
    out = dict(shards[0])
    for key in keys:
        out[key] = torch.cat([shard[key] for shard in shards])
    return out


def _expert_keys(state: Mapping[str, torch.Tensor], expert_keys: Collection[str] | None, name: str) -> list[str]:
    keys = list(state) if expert_keys is None else list(expert_keys)
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"expert_keys: expected keys of {name}, got {missing} that it lacks")
    return keys


def _num_experts(state: Mapping[str, torch.Tensor], keys: list[str], name: str) -> int | None:
    """E, the common dim 0 of the expert tensors (None without any)."""
    sizes = {}
    for key in keys:
        t = state[key]
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            got = f"shape {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}[{key!r}]: expected an expert tensor [E, ...], got {got}")
        sizes[key] = t.shape[0]
    if len(set(sizes.values())) > 1:
        raise ValueError(f"{name}: expected expert tensors with the same number of experts (dim 0), got {sizes}")
    return next(iter(sizes.values()), None)


def _expert_counts(
    x_sorted: torch.Tensor, split_sizes: torch.Tensor | Sequence[int], group: dist.ProcessGroup
) -> torch.Tensor:
    """The checked rows per expert, int64 on x's device."""
    tp.check_group("group", group)
    world = dist.get_world_size(group)
    if x_sorted.dim() == 0:
        raise ValueError("x_sorted: expected rows [N, ...], got a 0-d tensor")
    if not isinstance(split_sizes, torch.Tensor):
        split_sizes = torch.tensor(list(split_sizes), dtype=torch.int64)
    if split_sizes.dim() != 1 or split_sizes.shape[0] % world != 0 or split_sizes.shape[0] == 0:
        raise ValueError(
            f"split_sizes: expected [E] with E (the number of experts) divisible by the "
            f"group size {world}, got shape {list(split_sizes.shape)}"
        )
    return split_sizes.to(device=x_sorted.device, dtype=torch.int64).contiguous()


def _dispatch_capacity(
    x_sorted: torch.Tensor, counts: torch.Tensor, group: dist.ProcessGroup, capacity: object, chunks: object,
    overflow: Overflow,
) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], CapacityHandle]:
    if not isinstance(capacity, int) or isinstance(capacity, bool):
        raise TypeError(f"capacity: expected an int >= 1 (row slots per source->destination pair), got "
                        f"{type(capacity).__name__} {capacity!r}")
    if capacity < 1:
        raise ValueError(f"capacity: expected an int >= 1 (row slots per source->destination pair), got {capacity!r}")
    if not isinstance(chunks, int) or isinstance(chunks, bool):
        raise TypeError(f"chunks: expected an int in [1, capacity={capacity}], got {type(chunks).__name__} {chunks!r}")
    if not 1 <= chunks <= capacity:
        raise ValueError(f"chunks: expected an int in [1, capacity={capacity}], got {chunks!r}")
    return cx.dispatch_capacity(x_sorted, counts, group, capacity, chunks, overflow)


def _capacity_chunks(y_local: object, handle: CapacityHandle
                     ) -> tuple[Iterable[torch.Tensor], Callable[[int, torch.Tensor | None], None]]:
    """``combine``'s y_local for a capacity handle and the check of each chunk (``k, y_k``; then
    ``K, None`` after the last). A tensor or a sequence is checked whole here, on the host, before
    any collective: every chunk read from the dispatch's iterator, one tensor per chunk, its rows.
    An iterator is checked chunk by chunk as it yields, each before its exchange starts."""
    chunks = len(handle.windows)
    rows = [b - a for a, b in handle.chunk_rows()]
    if isinstance(y_local, (torch.Tensor, Sequence)):
        ys = [y_local] if isinstance(y_local, torch.Tensor) else list(y_local)
        _check_arrived(handle, chunks)
        got = [list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__ for y in ys]
        if len(ys) != len(rows) or any(not _has_rows(y, n) for y, n in zip(ys, rows)):
            raise ValueError(
                f"y_local: expected {len(rows)} chunk(s) of {rows} rows (the x_local rows dispatch delivered), got {got}"
            )
        if len({(y.shape[1:], y.dtype, y.device) for y in ys}) > 1:
            raise ValueError(f"y_local: expected chunks with the same trailing dims, dtype and device, got {got}")
        return ys, lambda k, y: None
    if not isinstance(y_local, Iterable):
        raise TypeError(f"y_local: expected a tensor, a sequence or an iterator of chunk outputs, got "
                        f"{type(y_local).__name__}")
    first: list[torch.Tensor] = []

    def check(k: int, y: torch.Tensor | None) -> None:
        if y is None:
            if k != chunks:
                raise ValueError(f"y_local: expected {chunks} chunk(s) from the iterator, got {k}")
            return
        if k >= chunks:
            raise ValueError(f"y_local: expected {chunks} chunk(s) from the iterator, got more")
        _check_arrived(handle, k + 1)
        if not _has_rows(y, rows[k]):
            got = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise ValueError(f"y_local: expected chunk {k} of {rows[k]} rows (the x_local rows dispatch delivered), "
                             f"got {got}")
        if first and (y.shape[1:], y.dtype, y.device) != (first[0].shape[1:], first[0].dtype, first[0].device):
            raise ValueError(f"y_local: expected chunks with the same trailing dims, dtype and device, got chunk {k} "
                             f"{list(y.shape)} {y.dtype} {y.device} after {list(first[0].shape)} {first[0].dtype} "
                             f"{first[0].device}")
        if not first:
            first.append(y)

    return y_local, check


def _check_arrived(handle: CapacityHandle, chunks: int) -> None:
    """The first ``chunks`` chunks of the dispatch's iterator were read (each waited for)."""
    if len(handle.arrived) < chunks:
        total = len(handle.windows)
        raise ValueError(
            f"handle: expected all {total} chunks of its dispatch_chunks iterator read (in order, the experts "
            f"run on each) before combine, got {len(handle.arrived)} read; a chunk not read was never waited for"
            if chunks == total else
            f"handle: expected chunk {chunks - 1} of its dispatch_chunks iterator read before its output reaches "
            f"combine, got {len(handle.arrived)} read; a chunk not read was never waited for"
        )


def _has_rows(y: object, n: int) -> bool:
    return isinstance(y, torch.Tensor) and y.dim() > 0 and y.shape[0] == n


def _reorder(
    received: list[int], world: int, local_experts: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gather indices between the source-major and expert-major row orders."""
    if local_experts == 1 or world == 1:
        return None, None
    sizes_sm = torch.tensor(received, dtype=torch.int64)
    sizes_em = sizes_sm.view(world, local_experts).t().reshape(-1)
    start_sm = torch.cumsum(sizes_sm, 0) - sizes_sm
    start_em = torch.cumsum(sizes_em, 0) - sizes_em
    # Where chunk (s, e) starts in each order, listed in expert-major chunk order.
    sm_of_em = start_sm.view(world, local_experts).t().reshape(-1)
    em_of_sm = start_em.view(local_experts, world).t().reshape(-1)
    rows = int(sizes_sm.sum())
    # Row j of chunk c sits at j - start(c) + start'(c) in the other order.
    to_em = torch.arange(rows) + torch.repeat_interleave(sm_of_em - start_em, sizes_em, output_size=rows)
    to_sm = torch.arange(rows) + torch.repeat_interleave(em_of_sm - start_sm, sizes_sm, output_size=rows)
    return to_em.to(device, non_blocking=True), to_sm.to(device, non_blocking=True)


def _all_to_all(x: torch.Tensor, out_splits: tuple[int, ...], in_splits: tuple[int, ...], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
    return out


def _take(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return x if index is None else x.index_select(0, index)


def _send(x: torch.Tensor, h: DispatchHandle) -> torch.Tensor:
    """Sorted rows -> this rank's expert-major rows."""
    return _take(_all_to_all(x, h.recv_splits, h.send_splits, h.group), h.to_expert_major)


def _return(y: torch.Tensor, h: DispatchHandle) -> torch.Tensor:
    """Expert-major rows -> the sorted rows they came from."""
    return _all_to_all(_take(y, h.to_source_major), h.send_splits, h.recv_splits, h.group)


class _Exchange(torch.autograd.Function):
    """Rows to the experts' ranks (``to_experts``) or back to where they came from; the
    backward sends the gradients the other way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, handle: DispatchHandle, to_experts: bool) -> torch.Tensor:
        ctx.handle, ctx.to_experts = handle, to_experts
        return _send(x, handle) if to_experts else _return(x, handle)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        if batched_cotangents(dy):
            refuse_batched_cotangents(quantized=False, communicating=["the expert-parallel exchange"])
        return (_return(dy, ctx.handle) if ctx.to_experts else _send(dy, ctx.handle)), None, None
