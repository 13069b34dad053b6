"""The fixed-capacity expert-parallel exchange behind ``dispatch(..., capacity=)`` and
``dispatch_chunks``: no host read of the routing, so a step captures in a CUDA graph.

Every source→destination pair of ranks gets ``capacity`` row *slots*, so every buffer has a
size the host knows before the routing does. The kept per-expert counts travel in one
equal-split ``all_to_all_single``; each rank places its rows into its slots by device index
maps (cumsums, ``searchsorted``), one equal-split ``all_to_all_single`` per chunk moves the
slots, and the receiver reorders them expert-major by a device permutation. A destination's
slots hold its rows in ``x_sorted`` order (by local expert, then token); rows past
``capacity`` are dropped, counted on the device, or fail a device assert.

Three row orders, one index map between each pair (built once per dispatch, in
``plan_exchange``): a sender's *rows* (``x_sorted``), the *slots* (the wire layout, the same
on both sides: chunk, then peer rank, then position), and a receiver's *local* rows (per
chunk: expert-major, within an expert by source, then zero padding that the last local
expert's split size covers). A chunk holds positions [lo, hi) of every pair's slots.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from fuseops.kernels.autodiff_state import batched_cotangents, refuse_batched_cotangents
from fuseops.ops.executor.second_backward import once_differentiable


class Overflow(enum.Enum):
    """What the exchange does with rows past a destination's capacity."""

    # A device assert fails (``torch._assert_async``: RuntimeError at once on CPU).
    ERROR = "error"
    # The rows contribute zero to the output (and get zero gradient); ``CapacityHandle.dropped`` counts them.
    DROP = "drop"

    @classmethod
    def parse(cls, value: object) -> Overflow:
        for mode in cls:
            if value is mode or value == mode.value:
                return mode
        raise ValueError(f"on_overflow: expected one of {[m.value for m in cls]}, got {value!r}")


def chunk_windows(capacity: int, chunks: int) -> tuple[tuple[int, int], ...]:
    """Slot positions [lo, hi) of each chunk: ``capacity`` split as evenly as possible, larger first."""
    q, rem = divmod(capacity, chunks)
    return tuple((k * q + min(k, rem), (k + 1) * q + min(k + 1, rem)) for k in range(chunks))


@dataclass(frozen=True)
class CapacityHandle:
    """What ``combine`` (and both backwards) need to undo a capacity dispatch, and what it
    dropped. Public: ``capacity``, ``windows`` (each chunk's slot positions [lo, hi)),
    ``dropped`` (0-d int64 device tensor: rows of this rank's ``x_sorted`` past capacity) and
    ``expert_rows`` ([E/P] int64 device tensor: rows each local expert received, padding
    excluded)."""

    group: dist.ProcessGroup
    world: int
    capacity: int
    windows: tuple[tuple[int, int], ...]
    dropped: torch.Tensor
    expert_rows: torch.Tensor
    # Sender: slots[z] = x_sorted[row_of_slot[z]] where slot_sent[z] (else zero), and back.
    row_of_slot: torch.Tensor
    slot_sent: torch.Tensor
    slot_of_row: torch.Tensor
    row_sent: torch.Tensor
    # Receiver, chunk-relative (a permutation within each chunk): local = slots[slot_of_local].
    slot_of_local: torch.Tensor
    local_of_slot: torch.Tensor
    # The chunks the dispatch's iterator has delivered so far (host bookkeeping, so that
    # ``combine`` refuses a chunk nobody waited for before it starts a collective).
    arrived: list[int] = field(default_factory=list, compare=False, repr=False)

    def chunk_rows(self) -> tuple[tuple[int, int], ...]:
        """Each chunk's [start, stop) in the slot (and local) row orders."""
        return tuple((self.world * lo, self.world * hi) for lo, hi in self.windows)


def _chunk_of(pos: torch.Tensor, q: int, rem: int) -> torch.Tensor:
    """The chunk holding each slot position (``chunk_windows``: ``rem`` chunks of q + 1, then q)."""
    wide = rem * (q + 1)
    return torch.where(pos < wide, pos // (q + 1), rem + (pos - wide) // q)


def plan_exchange(
    counts: torch.Tensor, rows: int, group: dist.ProcessGroup, capacity: int, chunks: int
) -> tuple[CapacityHandle, tuple[torch.Tensor, ...], torch.Tensor]:
    """Exchange the kept counts (one fixed-size all-to-all) and build the index maps.

    Args:
        counts: [E] int64 on the rows' device: this rank's rows per expert (``x_sorted``'s groups).
        rows: N, the rows of ``x_sorted``.
    Returns:
        ``(handle, splits, counts_ok)``: ``splits`` one [E/P] int64 device tensor per chunk
        (its local rows per expert, the last one covering the chunk's padding);
        ``counts_ok`` a 0-d bool, whether ``counts`` are non-negative and sum to ``rows``.
    """
    counts_ok = (counts >= 0).all() & (counts.sum() == rows)
    # Bad counts fail ``counts_ok``'s device assert once every collective is issued; until then
    # the maps are built from counts clamped into range, so nothing indexes out of bounds.
    counts = counts.clamp(min=0)
    world = dist.get_world_size(group)
    experts = counts.shape[0] // world
    device, cap = counts.device, capacity
    q, rem = divmod(cap, chunks)

    # Sender: a destination's rows fill its slots in order; the rest is dropped.
    per_pair = counts.view(world, experts)
    to_dest = per_pair.sum(1)
    row_end = torch.cumsum(to_dest, 0)
    row_start = row_end - to_dest
    kept = (cap - (torch.cumsum(per_pair, 1) - per_pair)).clamp(min=0).minimum(per_pair)
    sent_to = to_dest.clamp(max=cap)
    received = torch.empty_like(kept)
    dist.all_to_all_single(received, kept, group=group)

    # Every slot z: its chunk, the peer rank and the position in that pair's slots.
    z = torch.arange(world * cap, device=device)
    chunk = _chunk_of(z // world, q, rem)
    lo = chunk * q + chunk.clamp(max=rem)
    width = q + (chunk < rem).long()
    peer, pos = (z - world * lo) // width, lo + (z - world * lo) % width

    slot_sent = pos < sent_to[peer]
    row_of_slot = (row_start[peer] + pos).clamp(0, max(rows - 1, 0))
    i = torch.arange(rows, device=device)
    dest = torch.searchsorted(row_end, i, right=True).clamp(max=world - 1)
    at = i - row_start[dest]
    row_sent = at < cap
    at = at.clamp(max=cap - 1)
    at_chunk = _chunk_of(at, q, rem)
    at_lo = at_chunk * q + at_chunk.clamp(max=rem)
    slot_of_row = world * at_lo + dest * (q + (at_chunk < rem).long()) + at - at_lo

    # Receiver: the rows of (expert e, source s) sit at positions [first, last) of s's slots.
    first = torch.cumsum(received, 1) - received
    last = first + received
    k = torch.arange(chunks, device=device)
    k_lo = (k * q + k.clamp(max=rem)).view(chunks, 1, 1)
    k_hi = k_lo + q + (k < rem).long().view(chunks, 1, 1)
    # [chunks, E/P, P]: the rows of (e, s) in each chunk, and where they start expert-major.
    in_chunk = (last.t().unsqueeze(0).minimum(k_hi) - first.t().unsqueeze(0).maximum(k_lo)).clamp(min=0)
    flat = in_chunk.reshape(chunks, experts * world)
    em_start = torch.cumsum(flat, 1) - flat
    chunk_real = flat.sum(1)

    used = pos < received.sum(1)[peer]
    expert = torch.searchsorted(last[peer], pos.unsqueeze(1), right=True).squeeze(1).clamp(max=experts - 1)
    local_real = em_start[chunk, expert * world + peer] + pos - first[peer, expert].maximum(lo)
    # Unused slots (zeros from the sender) fill the chunk's padding rows, in slot order.
    unused = (~used).long()
    unused_before = torch.cumsum(unused, 0) - unused
    local_pad = chunk_real[chunk] + unused_before - unused_before[world * lo]
    local_of_slot = torch.where(used, local_real, local_pad)
    slot_of_local = torch.empty_like(local_of_slot).scatter_(0, world * lo + local_of_slot, z - world * lo)

    splits = in_chunk.sum(2)
    splits[:, -1] += world * (k_hi - k_lo).view(chunks) - chunk_real
    handle = CapacityHandle(
        group, world, cap, chunk_windows(cap, chunks), (to_dest - sent_to).sum(), received.sum(0),
        row_of_slot, slot_sent, slot_of_row, row_sent, slot_of_local, local_of_slot,
    )
    return handle, splits.unbind(0), counts_ok


def _gather(x: torch.Tensor, index: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``x[index]``, rows where ``keep`` is False zeroed (by ``masked_fill``: NaN-safe)."""
    if x.shape[0] == 0:
        return x.new_zeros((index.shape[0], *x.shape[1:]))
    out = x.index_select(0, index)
    return out if keep is None else out.masked_fill_(~keep.view(-1, *(1,) * (x.dim() - 1)), 0)


@dataclass
class InFlight:
    """One chunk's all-to-all: ``recv`` holds the arrived slots once ``wait()`` returns."""

    recv: torch.Tensor
    work: dist.Work
    # Kept alive until the exchange completes (gloo reads it on its own thread).
    send: torch.Tensor

    def wait(self) -> torch.Tensor:
        # NCCL: the current stream waits for the exchange, the host does not.
        self.work.wait()
        return self.recv


def _start(chunks: Sequence[torch.Tensor], group: dist.ProcessGroup) -> list[InFlight]:
    """Every chunk's equal-split all-to-all, issued before any is waited for."""
    flights = []
    for send in chunks:
        send = send.contiguous()
        recv = torch.empty_like(send)
        flights.append(InFlight(recv, dist.all_to_all_single(recv, send, group=group, async_op=True), send))
    return flights


def _slot_chunks(slots: torch.Tensor, h: CapacityHandle) -> list[torch.Tensor]:
    return [slots[a:b] for a, b in h.chunk_rows()]


def _refuse_batched(grads: tuple) -> None:
    if batched_cotangents(*grads):
        refuse_batched_cotangents(quantized=False, communicating=["the expert-parallel exchange"])


class SendRows(torch.autograd.Function):
    """x_sorted's rows into their slots, every chunk's all-to-all started (``flights`` gets
    them); returns the chunks' receive buffers, filled once ``ArriveRows`` waits. Backward:
    the gradients' slots back to the rows they came from (zero for dropped rows), once every
    chunk's return exchange, which ``ArriveRows``' backward started, has arrived."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, h: CapacityHandle, flights: list, returning: dict) -> tuple[torch.Tensor, ...]:
        ctx.h, ctx.returning = h, returning
        flights.extend(_start(_slot_chunks(_gather(x, h.row_of_slot, h.slot_sent), h), h.group))
        return tuple(f.recv for f in flights)

    @staticmethod
    @once_differentiable
    def backward(ctx, *d_recv: torch.Tensor | None):
        _refuse_batched(d_recv)
        h, returning = ctx.h, ctx.returning
        # A chunk whose rows got no gradient (its ``ArriveRows`` never ran backward; autograd hands
        # zeros here) still exchanges them: every rank runs the same collectives.
        for k in range(len(d_recv) - 1, -1, -1):
            if k not in returning:
                returning[k] = _start([d_recv[k]], h.group)[0]
        slots = torch.cat([returning.pop(k).wait() for k in range(len(d_recv))])
        return _gather(slots, h.slot_of_row, h.row_sent), None, None, None


class ArriveRows(torch.autograd.Function):
    """Waits for chunk ``k``'s all-to-all and orders its slots expert-major. Backward: the
    chunk's gradient back into slot order and its return exchange started at once, so that it
    travels while the experts' backward runs on the chunks before it (``SendRows`` waits)."""

    @staticmethod
    def forward(ctx, recv: torch.Tensor, h: CapacityHandle, k: int, flight: InFlight, returning: dict) -> torch.Tensor:
        ctx.h, ctx.k, ctx.rows, ctx.returning = h, k, slice(*h.chunk_rows()[k]), returning
        flight.wait()
        return recv.index_select(0, h.slot_of_local[ctx.rows])

    @staticmethod
    @once_differentiable
    def backward(ctx, d_local: torch.Tensor):
        _refuse_batched((d_local,))
        flight = _start([d_local.index_select(0, ctx.h.local_of_slot[ctx.rows])], ctx.h.group)[0]
        ctx.returning[ctx.k] = flight
        # Not read before ``SendRows``' backward waits for it.
        return flight.recv, None, None, None, None


class LeaveRows(torch.autograd.Function):
    """Chunk ``k``'s expert output, in slot order, on its way back: its all-to-all starts at
    once (``JoinRows`` waits), so it travels while the experts run on later chunks. Backward:
    waits for the chunk's gradient exchange (``JoinRows``' backward started it) and orders it
    expert-major."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, h: CapacityHandle, k: int, leaving: dict, arriving: dict) -> torch.Tensor:
        ctx.h, ctx.k, ctx.rows, ctx.arriving = h, k, slice(*h.chunk_rows()[k]), arriving
        leaving[k] = _start([y.index_select(0, h.local_of_slot[ctx.rows])], h.group)[0]
        # Not read before ``JoinRows`` waits for it.
        return leaving[k].recv

    @staticmethod
    @once_differentiable
    def backward(ctx, d_slots: torch.Tensor):
        _refuse_batched((d_slots,))
        # ``d_slots`` is that exchange's receive buffer.
        ctx.arriving.pop(ctx.k).wait()
        return d_slots.index_select(0, ctx.h.slot_of_local[ctx.rows]), None, None, None, None


class JoinRows(torch.autograd.Function):
    """Every chunk's returned slots, once arrived, into the rows they came from (zero for
    dropped rows). Backward: the gradients' slots dispatched, every chunk's exchange started
    (the last chunk's first: the engine runs the experts' backward from the last chunk), none
    waited for here (``LeaveRows`` waits)."""

    @staticmethod
    def forward(ctx, h: CapacityHandle, leaving: dict, arriving: dict, *recvs: torch.Tensor) -> torch.Tensor:
        ctx.h, ctx.arriving = h, arriving
        slots = torch.cat([leaving.pop(k).wait() for k in range(len(recvs))])
        return _gather(slots, h.slot_of_row, h.row_sent)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        _refuse_batched((dy,))
        h = ctx.h
        chunks = _slot_chunks(_gather(dy, h.row_of_slot, h.slot_sent), h)
        order = range(len(chunks) - 1, -1, -1)
        for k, flight in zip(order, _start([chunks[k] for k in order], h.group)):
            ctx.arriving[k] = flight
        return None, None, None, *(ctx.arriving[k].recv for k in range(len(chunks)))


def combine_capacity(y_chunks: Iterable[torch.Tensor], h: CapacityHandle,
                     check: Callable[[int, torch.Tensor], None]) -> torch.Tensor:
    """``combine`` for a capacity handle: each chunk's return exchange starts as the chunk comes
    (``check(k, y_k)`` first, on the host), so chunks from a generator travel while the
    experts run on the next."""
    leaving: dict[int, InFlight] = {}
    arriving: dict[int, InFlight] = {}
    recvs = []
    for k, y in enumerate(y_chunks):
        check(k, y)
        recvs.append(LeaveRows.apply(y, h, k, leaving, arriving))
    check(len(recvs), None)
    return JoinRows.apply(h, leaving, arriving, *recvs)


def dispatch_capacity(
    x_sorted: torch.Tensor, counts: torch.Tensor, group: dist.ProcessGroup, capacity: int, chunks: int,
    overflow: Overflow,
) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], CapacityHandle]:
    """The checked arguments of ``dispatch_chunks``: plans, starts every chunk's exchange,
    asserts (on the device) after every collective is issued, so that a rank that fails
    leaves none of its peers waiting."""
    handle, splits, counts_ok = plan_exchange(counts, x_sorted.shape[0], group, capacity, chunks)
    flights: list[InFlight] = []
    # Chunk -> its gradient's return exchange, started by ``ArriveRows``' backward.
    returning: dict[int, InFlight] = {}
    recvs = SendRows.apply(x_sorted, handle, flights, returning)
    torch._assert_async(
        counts_ok, f"split_sizes: expected non-negative sizes summing to the {x_sorted.shape[0]} rows of x_sorted"
    )
    if overflow is Overflow.ERROR:
        torch._assert_async(
            handle.dropped == 0,
            f"dispatch: this rank has more rows for one destination rank than capacity={capacity} (row slots per "
            "source->destination pair); raise capacity (fuseops.moe.expert_capacity) or pass on_overflow='drop'",
        )

    def arrivals() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for k, (recv, flight, split) in enumerate(zip(recvs, flights, splits)):
            x_k = ArriveRows.apply(recv, handle, k, flight, returning)
            # Counted before the yield: ``dispatch`` takes its one chunk and never resumes.
            handle.arrived.append(k)
            yield x_k, split

    return arrivals(), handle
