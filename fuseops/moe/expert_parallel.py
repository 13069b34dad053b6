"""Expert parallelism: send each token row to the rank that owns its expert, and back.

E experts are split evenly over the P ranks of a process group: rank r owns experts
``[r * E/P, (r + 1) * E/P)``. On every rank::

    x_sorted, split_sizes, row_map = fuseops.moe.permute(x, expert_ids, E)
    x_local, local_splits, handle = dispatch(x_sorted, split_sizes, group)
    y_local = experts(x_local, local_splits, local_splits)    # GroupedLinear(E/P, ...) ...
    y_sorted = combine(y_local, handle)
    y = fuseops.moe.unpermute(y_sorted, row_map, weights)

The exact exchange (the default, ``exact_exchange.py``) sends rank r's experts' rows (a
contiguous block, since ``permute`` grouped them by expert) with one variable-size
``all_to_all_single`` and reorders what arrives expert-major by a device gather; ``combine`` is
its inverse, and each one's backward is the other's forward. The split sizes of a variable-size
all-to-all are host ints, so it reads the exchanged per-expert counts on the host once per
``dispatch`` (2E ints); the reorder's index maps are built on the device from them.

``dispatch(..., capacity=C)`` reads nothing on the host (``capacity_exchange.py``): each
source→destination pair gets C row slots, the buffers have fixed sizes, and a step captures
in a CUDA graph. ``x_local`` then has P * C rows: the rows received, expert-major, then zero
padding that the last local expert's split size covers (its outputs are discarded and its
gradients are zero). Rows past C fail a device assert (``on_overflow="error"``) or are
dropped (``"drop"``: they contribute zero, and ``handle.dropped`` counts them).
``dispatch_chunks`` cuts either exchange into pieces whose all-to-alls are all in flight at
once, yielded as they arrive so that the experts run on one while the next travels; exact, the
rows a rank routes to its own experts come first, with no exchange. It is a second function
because it returns an iterator of pieces where ``dispatch`` returns rows; ``combine`` takes
either, with the handle that made them.

``expert_state_dict_for_rank`` and ``gather_expert_state_dicts`` move expert weights between
world sizes (a checkpoint saved on W ranks, loaded on W').
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fuseops.moe import capacity_exchange as cx
from fuseops.moe import exact_exchange as ex
from fuseops.moe.capacity_exchange import CapacityHandle, Overflow
from fuseops.moe.exact_exchange import DispatchHandle, ExactChunksHandle
from fuseops.ops.parallel import tensor_parallel as tp


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
    # The one host read (see the module docstring).
    c = ex.exchange_counts(counts, x_sorted.shape[0], group)
    handle = ex.plan_dispatch(c)
    local_splits = c.recv_counts.view(c.world, c.local).sum(0)
    return ex.Exchange.apply(x_sorted, handle, True), local_splits, handle


def dispatch_chunks(
    x_sorted: torch.Tensor,
    split_sizes: torch.Tensor | Sequence[int],
    group: dist.ProcessGroup,
    *,
    capacity: int | None = None,
    chunks: int,
    on_overflow: str | Overflow = "error",
) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], ExactChunksHandle | CapacityHandle]:
    """``dispatch`` in pieces whose all-to-alls are all issued (``async_op=True``) before the
    first is waited for, so that the experts run on the pieces that arrived while the rest
    travel::

        arrived, handle = dispatch_chunks(x_sorted, split_sizes, group, chunks=2)
        y_sorted = combine((experts(x_k, splits_k, splits_k) for x_k, splits_k in arrived), handle)

    ``combine`` given a generator starts each piece's return exchange as the piece's output
    comes, so it travels while the experts run on the next piece (a list starts them together).

    The exact exchange (``capacity=None``, the default) yields ``chunks + 1`` pieces: first the
    rows this rank routes to its own experts, at once (no exchange: a view of ``x_sorted``), then
    the remote rows in ``chunks`` pieces, piece k holding part k of every remote rank's rows
    (each pair's rows split as evenly as possible). It reads the counts on the host once, as
    ``dispatch`` does. With ``capacity=C`` it yields ``chunks`` pieces, chunk k carrying slot
    positions [lo_k, hi_k) of every source→destination pair (``handle.windows``: C split as
    evenly as possible), and reads nothing on the host.

    Every piece must be read, in order, before ``combine`` (which raises ValueError otherwise: a
    piece not read was never waited for). In the backward each piece's input gradient starts
    home as soon as the experts' backward on it is done, while the experts' backward runs on the
    pieces before it; with a generator, each piece's output gradient too is waited for only
    where its piece's backward needs it.

    Args:
        x_sorted, split_sizes, group, on_overflow: as for ``dispatch``.
        capacity: ``None``: the exact exchange; C >= 1: row slots per source→destination pair
            (the same on every rank).
        chunks: K >= 1 (the same on every rank); with ``capacity``, K <= C.
    Returns:
        ``(arrived, handle)``: ``arrived`` yields pairs ``(x_k, splits_k)``, x_k that piece's
        rows grouped by local expert (with ``capacity``: [P * (hi_k - lo_k), ...], then zero
        padding that the last split covers) and splits_k [E/P] int64 on x's device; ``handle``
        for ``combine``.
    """
    overflow = Overflow.parse(on_overflow)
    counts = _expert_counts(x_sorted, split_sizes, group)
    if capacity is not None:
        return _dispatch_capacity(x_sorted, counts, group, capacity, chunks, overflow)
    if overflow is not Overflow.ERROR:
        raise ValueError(f"on_overflow: {on_overflow!r} applies to a capacity exchange; the exact exchange "
                         "(capacity=None) never overflows: pass capacity= or leave on_overflow as 'error'")
    if not isinstance(chunks, int) or isinstance(chunks, bool):
        raise TypeError(f"chunks: expected an int >= 1, got {type(chunks).__name__} {chunks!r}")
    if chunks < 1:
        raise ValueError(f"chunks: expected an int >= 1, got {chunks!r}")
    c = ex.exchange_counts(counts, x_sorted.shape[0], group)
    handle, own_splits = ex.plan_chunks(c, chunks, x_sorted.device)
    # Pieces in flight to this rank's experts; and, in the backward, their gradients going home.
    flights, back = ex.Transit(), ex.Transit()
    x_own, *recvs = ex.SendPieces.apply(x_sorted, handle, flights, back)

    def arrivals() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        handle.arrived.append(0)
        yield x_own, own_splits
        for k, recv in enumerate(recvs):
            x_k = ex.ArrivePiece.apply(recv, handle, k, flights, back)
            handle.arrived.append(k + 1)
            yield x_k, handle.pieces[k].splits

    return arrivals(), handle


def combine(y_local: torch.Tensor | Sequence[torch.Tensor] | Iterable[torch.Tensor],
            handle: DispatchHandle | ExactChunksHandle | CapacityHandle) -> torch.Tensor:
    """Send the expert outputs back where ``dispatch`` took their rows from.

    Args:
        y_local: [M, ...] rows in ``dispatch``'s x_local order (the trailing dims may
            differ from x_sorted's); for a ``dispatch_chunks`` handle, the pieces' outputs
            in order: a sequence (a single tensor for one piece), or an iterator, whose pieces'
            return exchanges start as they come (overlapping the experts on the next piece).
        handle: the ``dispatch`` or ``dispatch_chunks`` that produced the rows; every piece
            of a ``dispatch_chunks`` iterator must have been read (from an iterator of outputs:
            each piece before its output comes).
    Returns:
        y_sorted [N, ...] in x_sorted's row order (ready for ``fuseops.moe.unpermute``);
        rows the capacity exchange dropped are zero.
    Raises:
        ValueError: ``y_local`` does not have the rows (or pieces) dispatch delivered, or a
            piece of ``dispatch_chunks`` was not read; checked on the host from the handle
            before any collective starts (from an iterator: each piece before its exchange
            starts, so an error at a later piece leaves the other ranks waiting in its
            collective until the process group's timeout).
        TypeError: ``y_local`` is neither a tensor, a sequence nor an iterator.
    """
    if isinstance(handle, CapacityHandle):
        rows = tuple(b - a for a, b in handle.chunk_rows())
        chunks, check = _pieces(y_local, rows, handle.arrived)
        return cx.combine_capacity(chunks, handle, check)
    if isinstance(handle, ExactChunksHandle):
        chunks, check = _pieces(y_local, handle.chunk_rows(), handle.arrived)
        leaving, arriving = ex.Transit(), ex.Transit()
        y_own, tickets = None, []
        for k, y in enumerate(chunks):
            check(k, y)
            if k == 0:
                y_own = y
            else:
                tickets.append(ex.LeavePiece.apply(y, handle, k - 1, leaving, arriving))
        check(len(tickets) + 1, None)
        return ex.JoinPieces.apply(y_own, handle, leaving, arriving, *tickets)
    if not isinstance(handle, DispatchHandle):
        raise TypeError(f"handle: expected what dispatch or dispatch_chunks returned, got {type(handle).__name__}")
    if not isinstance(y_local, torch.Tensor) or y_local.dim() == 0 or y_local.shape[0] != sum(handle.recv_splits):
        got = list(y_local.shape) if isinstance(y_local, torch.Tensor) else type(y_local).__name__
        raise ValueError(
            f"y_local: expected the {sum(handle.recv_splits)} rows dispatch delivered to this rank, got shape {got}"
        )
    return ex.Exchange.apply(y_local, handle, False)


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


def _pieces(y_local: object, rows: tuple[int, ...], arrived: list[int]
            ) -> tuple[Iterable[torch.Tensor], Callable[[int, torch.Tensor | None], None]]:
    """``combine``'s y_local for a ``dispatch_chunks`` handle and the check of each piece (``k, y_k``;
    then ``K, None`` after the last), ``rows`` each piece's row count and ``arrived`` the pieces
    read from the dispatch's iterator. A tensor or a sequence is checked whole here, on the host,
    before any collective: every piece read, one tensor per piece, its rows. An iterator is checked
    piece by piece as it yields, each before its exchange starts."""
    chunks = len(rows)
    if isinstance(y_local, (torch.Tensor, Sequence)):
        ys = [y_local] if isinstance(y_local, torch.Tensor) else list(y_local)
        _check_arrived(arrived, chunks, chunks)
        got = [list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__ for y in ys]
        if len(ys) != len(rows) or any(not _has_rows(y, n) for y, n in zip(ys, rows)):
            raise ValueError(
                f"y_local: expected {len(rows)} chunk(s) of {list(rows)} rows (the x_local rows dispatch delivered), "
                f"got {got}"
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
        _check_arrived(arrived, chunks, k + 1)
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


def _check_arrived(arrived: list[int], total: int, chunks: int) -> None:
    """The first ``chunks`` of the ``total`` chunks of the dispatch's iterator were read (each waited for)."""
    if len(arrived) < chunks:
        raise ValueError(
            f"handle: expected all {total} chunks of its dispatch_chunks iterator read (in order, the experts "
            f"run on each) before combine, got {len(arrived)} read; a chunk not read was never waited for"
            if chunks == total else
            f"handle: expected chunk {chunks - 1} of its dispatch_chunks iterator read before its output reaches "
            f"combine, got {len(arrived)} read; a chunk not read was never waited for"
        )


def _has_rows(y: object, n: int) -> bool:
    return isinstance(y, torch.Tensor) and y.dim() > 0 and y.shape[0] == n
