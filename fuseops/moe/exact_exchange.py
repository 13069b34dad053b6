"""The exact expert-parallel exchange behind ``dispatch`` and ``dispatch_chunks(capacity=None)``:
every row arrives. The per-expert counts travel in one equal-split all-to-all and are read on the
host once per dispatch (a variable-size all-to-all takes its sizes there); nothing else touches the
host: the row-order maps are built on the device from the exchanged counts, sized by host ints.

Rows arrive source-major (by source rank, each source's rows by local expert, as ``permute``
sorted them); the experts want them expert-major. ``dispatch`` moves all rows in one all-to-all and
reorders them with one device gather. ``dispatch_chunks`` hands the experts pieces instead: first
this rank's own rows, which need no exchange (a view of ``x_sorted``), then the remote rows in K
pieces whose all-to-alls are all in flight at once (piece k holds part k of every remote pair's
rows). With two ranks a piece holds one source's rows, already grouped by expert, and its rows are
sent from and returned into contiguous ranges: no gather and no copy at all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from fuseops.kernels.autodiff_state import batched_cotangents, refuse_batched_cotangents
from fuseops.moe.capacity_exchange import InFlight, chunk_windows
from fuseops.ops.executor.second_backward import once_differentiable

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Counts:
    """The exchanged counts, on the host: ``sent[e]`` rows of this rank for expert e,
    ``received[s * L + e]`` rows from rank s for local expert e (L = E / P); ``recv_counts`` the
    latter on the device."""

    group: dist.ProcessGroup
    world: int
    rank: int
    sent: tuple[int, ...]
    received: tuple[int, ...]
    recv_counts: torch.Tensor

    @property
    def local(self) -> int:
        return len(self.received) // self.world

    def to_rank(self, d: int) -> int:
        return sum(self.sent[d * self.local:(d + 1) * self.local])

    def from_rank(self, s: int) -> int:
        return sum(self.received[s * self.local:(s + 1) * self.local])


def exchange_counts(counts: torch.Tensor, rows: int, group: dist.ProcessGroup) -> Counts:
    """One equal-split all-to-all of the per-expert counts [E] and the one host read."""
    world = dist.get_world_size(group)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    host = torch.cat([counts, recv_counts]).tolist()
    sent, received = tuple(host[: len(host) // 2]), tuple(host[len(host) // 2:])
    if sum(sent) != rows or min(sent) < 0:
        raise ValueError(
            f"split_sizes: expected non-negative sizes summing to the {rows} rows of x_sorted, got sum {sum(sent)}"
            + ("" if min(sent) >= 0 else f" with a negative size {min(sent)}")
        )
    return Counts(group, world, dist.get_rank(group), sent, received, recv_counts)


def order_maps(sizes: torch.Tensor, rows: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gather indices between the source-major and expert-major orders of rows counted by
    ``sizes`` [S, L] (device; rows of source s for expert e), ``rows`` their sum (a host int, so
    nothing syncs): ``expert_major = source_major[to_em]``, ``source_major = expert_major[to_sm]``.
    ``(None, None)`` where both orders are the same (one source or one expert)."""
    sources, local = sizes.shape
    if sources == 1 or local == 1:
        return None, None
    flat_sm = sizes.reshape(-1)
    start_sm = torch.cumsum(flat_sm, 0) - flat_sm
    sizes_em = sizes.t().reshape(-1)
    start_em = torch.cumsum(sizes_em, 0) - sizes_em
    # Row j of chunk (e, s) sits at j - start_em + start_sm in source-major order.
    shift = start_sm.view(sources, local).t().reshape(-1) - start_em
    position = torch.arange(rows, device=sizes.device)
    to_em = position + torch.repeat_interleave(shift, sizes_em, output_size=rows)
    to_sm = torch.empty_like(to_em).scatter_(0, to_em, position)
    return to_em, to_sm


def _refuse_batched(*grads: torch.Tensor | None) -> None:
    if batched_cotangents(*grads):
        refuse_batched_cotangents(quantized=False, communicating=["the expert-parallel exchange"])


def _take(x: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    return x if index is None else x.index_select(0, index)


def _merged(ranges: Ranges) -> Ranges:
    """The non-empty ranges, adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b > a:
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
    return tuple(out)


def rows_at(x: torch.Tensor, ranges: Ranges) -> torch.Tensor:
    """``x``'s rows at ``ranges`` in order: a view when they form one range."""
    ranges = _merged(ranges)
    if len(ranges) <= 1:
        a, b = ranges[0] if ranges else (0, 0)
        return x[a:b]
    return torch.cat([x[a:b] for a, b in ranges])


def start(send: torch.Tensor, out: torch.Tensor, out_splits: tuple[int, ...], in_splits: tuple[int, ...],
          group: dist.ProcessGroup) -> InFlight:
    """A variable-size all-to-all issued without waiting (NCCL: on its own stream, after the current
    stream's work so far)."""
    send = send.contiguous()
    work = dist.all_to_all_single(out, send, list(out_splits), list(in_splits), group=group, async_op=True)
    return InFlight(out, work, send)


@dataclass(frozen=True)
class DispatchHandle:
    """What ``combine`` (and both backwards) need to undo an exact ``dispatch``."""

    group: dist.ProcessGroup
    # Rows this rank sends to / receives from each rank (host ints, length P).
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    # x_local = received[to_expert_major]; received = x_local[to_source_major]
    # (None when there is one local expert or one rank: both orders are the same).
    to_expert_major: torch.Tensor | None
    to_source_major: torch.Tensor | None


def plan_dispatch(c: Counts) -> DispatchHandle:
    send = tuple(c.to_rank(d) for d in range(c.world))
    recv = tuple(c.from_rank(s) for s in range(c.world))
    to_em, to_sm = order_maps(c.recv_counts.view(c.world, c.local), sum(recv))
    return DispatchHandle(c.group, send, recv, to_em, to_sm)


def _all_to_all(x: torch.Tensor, out_splits: tuple[int, ...], in_splits: tuple[int, ...], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
    return out


def _send(x: torch.Tensor, h: DispatchHandle) -> torch.Tensor:
    """Sorted rows -> this rank's expert-major rows."""
    return _take(_all_to_all(x, h.recv_splits, h.send_splits, h.group), h.to_expert_major)


def _return(y: torch.Tensor, h: DispatchHandle) -> torch.Tensor:
    """Expert-major rows -> the sorted rows they came from."""
    return _all_to_all(_take(y, h.to_source_major), h.send_splits, h.recv_splits, h.group)


class Exchange(torch.autograd.Function):
    """Rows to the experts' ranks (``to_experts``) or back to where they came from; the
    backward sends the gradients the other way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, handle: DispatchHandle, to_experts: bool) -> torch.Tensor:
        ctx.handle, ctx.to_experts = handle, to_experts
        return _send(x, handle) if to_experts else _return(x, handle)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        _refuse_batched(dy)
        return (_return(dy, ctx.handle) if ctx.to_experts else _send(dy, ctx.handle)), None, None


@dataclass(frozen=True)
class Piece:
    """One piece of the remote rows. ``send``: for each rank d, the range of ``x_sorted`` rows
    it carries there (empty for this rank); ``send_splits`` / ``recv_splits`` their sizes and
    the rows it brings from each rank; ``splits`` [L] its rows per local expert (device);
    ``to_em`` / ``to_sm`` its row-order maps (None: it arrives expert-major)."""

    send: Ranges
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    splits: torch.Tensor
    to_em: torch.Tensor | None
    to_sm: torch.Tensor | None


@dataclass(frozen=True)
class ExactChunksHandle:
    """What ``combine`` (and both backwards) need to undo an exact ``dispatch_chunks``: this
    rank's own rows ``own`` (a range of ``x_sorted``, yielded first) and the remote ``pieces``."""

    group: dist.ProcessGroup
    rows: int
    own: tuple[int, int]
    pieces: tuple[Piece, ...]
    # The chunks the dispatch's iterator has delivered so far (see ``CapacityHandle.arrived``).
    arrived: list[int] = field(default_factory=list, compare=False, repr=False)

    def chunk_rows(self) -> tuple[int, ...]:
        """Rows of each chunk the iterator yields: the own rows, then each piece's."""
        return (self.own[1] - self.own[0], *(sum(p.recv_splits) for p in self.pieces))


def plan_chunks(c: Counts, chunks: int, device: torch.device) -> tuple[ExactChunksHandle, torch.Tensor]:
    """Cut every remote pair's rows into ``chunks`` ranges (``chunk_windows``), all on host ints;
    the pieces' per-(source, expert) counts go to the device in one copy. Returns the handle and
    the own rows' splits [L] (device)."""
    world, local, me = c.world, c.local, c.rank
    sent_start = [0, *itertools.accumulate(c.to_rank(d) for d in range(world))]
    # [K][P][L]: rows of (source s, local expert e) in piece k; a pair's rows are cut into
    # row windows, and an expert's rows are a range within the pair's.
    sizes = [[[0] * local for _ in range(world)] for _ in range(chunks)]
    for s in range(world):
        if s == me:
            continue
        counts = c.received[s * local:(s + 1) * local]
        ends = list(itertools.accumulate(counts))
        for k, (lo, hi) in enumerate(chunk_windows(c.from_rank(s), chunks)):
            for e in range(local):
                first = ends[e] - counts[e]
                sizes[k][s][e] = max(0, min(ends[e], hi) - max(first, lo))
    on_device = torch.tensor(sizes, dtype=torch.int64).view(chunks, world, local).to(device)
    pieces = []
    windows_to = [chunk_windows(c.to_rank(d), chunks) for d in range(world)]
    for k in range(chunks):
        send = tuple((0, 0) if d == me else (sent_start[d] + windows_to[d][k][0], sent_start[d] + windows_to[d][k][1])
                     for d in range(world))
        recv_splits = tuple(sum(sizes[k][s]) for s in range(world))
        sources = sum(1 for n in recv_splits if n)
        to_em, to_sm = order_maps(on_device[k], sum(recv_splits)) if sources > 1 else (None, None)
        pieces.append(Piece(send, tuple(b - a for a, b in send), recv_splits, on_device[k].sum(0), to_em, to_sm))
    own = (sent_start[me], sent_start[me + 1])
    return ExactChunksHandle(c.group, sum(c.sent), own, tuple(pieces)), c.recv_counts.view(world, local)[me]


@dataclass
class Transit:
    """One direction's exchanges in flight (by piece) and the rows they land in (allocated by the
    first exchange, so that a piece whose rows form one range lands there without a copy)."""

    flights: dict[int, InFlight] = field(default_factory=dict)
    out: torch.Tensor | None = None

    def landing(self, like: torch.Tensor, rows: int, ranges: Ranges) -> torch.Tensor:
        if self.out is None:
            self.out = like.new_empty((rows, *like.shape[1:]))
        merged = _merged(ranges)
        if len(merged) <= 1:
            a, b = merged[0] if merged else (0, 0)
            return self.out[a:b]
        return like.new_empty((sum(b - a for a, b in merged), *like.shape[1:]))

    def settle(self, k: int, ranges: Ranges) -> None:
        """Waits for piece k's exchange; copies its rows into place unless they landed there."""
        flight = self.flights.pop(k)
        flight.wait()
        merged = _merged(ranges)
        if len(merged) > 1:
            at = 0
            for a, b in merged:
                self.out[a:b].copy_(flight.recv[at:at + b - a])
                at += b - a


def _start_piece(h: ExactChunksHandle, k: int, send: torch.Tensor, to_experts: bool, transit: Transit
                 ) -> InFlight:
    """Piece k's exchange: to the experts (sent from ``x_sorted``'s ranges, received in a new
    buffer) or back (received into ``transit``'s rows)."""
    p = h.pieces[k]
    if to_experts:
        out = send.new_empty((sum(p.recv_splits), *send.shape[1:]))
        return start(send, out, p.recv_splits, p.send_splits, h.group)
    return start(send, transit.landing(send, h.rows, p.send), p.send_splits, p.recv_splits, h.group)


class SendPieces(torch.autograd.Function):
    """The own rows (a view) and every remote piece's exchange started; returns the pieces'
    receive buffers, filled once ``ArrivePiece`` waits. Backward: the own rows' gradient and
    every piece's returned gradient (``ArrivePiece``'s backward started them) in place."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, h: ExactChunksHandle, flights: Transit, back: Transit):
        ctx.h, ctx.back = h, back
        for k, p in enumerate(h.pieces):
            flights.flights[k] = _start_piece(h, k, rows_at(x, p.send), True, flights)
        return (x[h.own[0]:h.own[1]], *(flights.flights[k].recv for k in range(len(h.pieces))))

    @staticmethod
    @once_differentiable
    def backward(ctx, d_own: torch.Tensor | None, *d_recv: torch.Tensor | None):
        _refuse_batched(d_own, *d_recv)
        h, back = ctx.h, ctx.back
        like = next(g for g in (d_own, *d_recv) if g is not None)
        # A piece whose rows got no gradient (its ``ArrivePiece`` never ran backward) still
        # exchanges zeros: every rank runs the same collectives.
        for k in range(len(h.pieces) - 1, -1, -1):
            if k not in back.flights:
                zeros = like.new_zeros((sum(h.pieces[k].recv_splits), *like.shape[1:]))
                back.flights[k] = _start_piece(h, k, zeros, False, back)
        if back.out is None:
            back.out = like.new_empty((h.rows, *like.shape[1:]))
        dx = back.out
        own = dx[h.own[0]:h.own[1]]
        if d_own is None:
            own.zero_()
        else:
            own.copy_(d_own)
        for k, p in enumerate(h.pieces):
            back.settle(k, p.send)
        back.out = None
        return dx, None, None, None


class ArrivePiece(torch.autograd.Function):
    """Waits for piece k's exchange and orders its rows expert-major. Backward: the piece's
    gradient back into source order, its return exchange started at once (it travels while the
    experts' backward runs on the pieces before it; ``SendPieces``' backward waits)."""

    @staticmethod
    def forward(ctx, recv: torch.Tensor, h: ExactChunksHandle, k: int, flights: Transit, back: Transit):
        ctx.h, ctx.k, ctx.back = h, k, back
        flights.flights.pop(k).wait()
        return _take(recv, h.pieces[k].to_em)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_local: torch.Tensor):
        _refuse_batched(d_local)
        d_recv = _take(d_local, ctx.h.pieces[ctx.k].to_sm)
        ctx.back.flights[ctx.k] = _start_piece(ctx.h, ctx.k, d_recv, False, ctx.back)
        return d_recv, None, None, None, None


class LeavePiece(torch.autograd.Function):
    """Piece k's expert output, in source order, on its way back into the sorted rows (its
    exchange starts at once; ``JoinPieces`` waits); returns an empty ticket that orders the
    autograd graph. Backward: waits for the piece's gradient exchange (``JoinPieces``' backward
    started it) and orders it expert-major."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, h: ExactChunksHandle, k: int, leaving: Transit, arriving: Transit):
        ctx.h, ctx.k, ctx.arriving = h, k, arriving
        leaving.flights[k] = _start_piece(h, k, _take(y, h.pieces[k].to_sm), False, leaving)
        return y.new_empty(0)

    @staticmethod
    @once_differentiable
    def backward(ctx, _ticket: torch.Tensor):
        flight = ctx.arriving.flights.pop(ctx.k)
        flight.wait()
        return _take(flight.recv, ctx.h.pieces[ctx.k].to_em), None, None, None, None


class JoinPieces(torch.autograd.Function):
    """The sorted rows: the own rows' output copied in, every piece's returned rows once arrived.
    Backward: every piece's gradient exchange started (the last piece's first: the engine runs
    the experts' backward from the last piece), none waited for here (``LeavePiece`` waits)."""

    @staticmethod
    def forward(ctx, y_own: torch.Tensor, h: ExactChunksHandle, leaving: Transit, arriving: Transit,
                *tickets: torch.Tensor) -> torch.Tensor:
        ctx.h, ctx.arriving = h, arriving
        if leaving.out is None:
            leaving.out = y_own.new_empty((h.rows, *y_own.shape[1:]))
        leaving.out[h.own[0]:h.own[1]].copy_(y_own)
        for k, p in enumerate(h.pieces):
            leaving.settle(k, p.send)
        out, leaving.out = leaving.out, None
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        _refuse_batched(dy)
        h = ctx.h
        for k in range(len(h.pieces) - 1, -1, -1):
            ctx.arriving.flights[k] = _start_piece(h, k, rows_at(dy, h.pieces[k].send), True, ctx.arriving)
        return (dy[h.own[0]:h.own[1]], None, None, None, *(dy.new_empty(0) for _ in h.pieces))
