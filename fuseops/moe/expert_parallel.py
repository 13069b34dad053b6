"""Expert parallelism: send each token row to the rank that owns its expert, and back.

E experts are split evenly over the P ranks of a process group: rank r owns experts
``[r * E/P, (r + 1) * E/P)``. On every rank::

    x_sorted, split_sizes, row_map = fuseops.moe.permute(x, expert_ids, E)
    x_local, local_splits, handle = dispatch(x_sorted, split_sizes, group)
    y_local = experts(x_local, local_splits, local_splits)    # GroupedLinear(E/P, ...) ...
    y_sorted = combine(y_local, handle)
    y = fuseops.moe.unpermute(y_sorted, row_map, weights)

``dispatch`` sends the rows of rank r's experts (a contiguous block, since ``permute``
grouped them by expert) to rank r with one ``all_to_all_single``, then reorders what
arrives from source-major ([source][local expert]) to expert-major, so the local rows
are grouped contiguously by expert as ``GroupedLinear`` wants. ``combine`` is its exact
inverse. Both are differentiable: each one's backward is the other's forward.

Host sync: ``all_to_all_single`` takes its split sizes as Python ints, and the receive
buffer must be allocated with a host-known row count, so ``dispatch`` exchanges the
per-expert counts (one small all-to-all on the device) and then reads them on the host:
one device-to-host copy of 2E ints per dispatch. That sync is unavoidable with
variable-size all-to-all (only a fixed-capacity, padded exchange would avoid it).
``combine`` and both backwards reuse the host counts kept in the handle: no more syncs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from fuseops.kernels.autodiff_state import batched_cotangents, refuse_batched_cotangents
from fuseops.ops.executor.second_backward import once_differentiable
from fuseops.ops.parallel import tensor_parallel as tp


@dataclass(frozen=True)
class DispatchHandle:
    """What ``combine`` (and both backwards) need to undo a ``dispatch``."""

    group: dist.ProcessGroup
    # Rows this rank sends to / receives from each rank (host ints, length P).
    send_splits: tuple[int, ...]
    recv_splits: tuple[int, ...]
    # x_local = received[to_expert_major]; received = x_local[to_source_major]
    # (None when there is one local expert: both orders are the same).
    to_expert_major: torch.Tensor | None
    to_source_major: torch.Tensor | None


def dispatch(
    x_sorted: torch.Tensor, split_sizes: torch.Tensor | Sequence[int], group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor, DispatchHandle]:
    """Send each row to the rank that owns its expert.

    Args:
        x_sorted: [N, ...] rows grouped by expert (``fuseops.moe.permute``'s output).
        split_sizes: [E] rows per expert (device tensor, CPU tensor or list of ints),
            summing to N; E must divide by the group size P.
        group: the expert-parallel process group.
    Returns:
        ``(x_local, local_splits, handle)``: x_local [M, ...] the rows for this rank's
        E/P experts, grouped by local expert (within an expert, by source rank, each
        source's rows in their order); local_splits [E/P] int64 on x's device;
        ``handle`` for ``combine``.
    """
    tp.check_group("group", group)
    world = dist.get_world_size(group)
    if x_sorted.dim() == 0:
        raise ValueError("x_sorted: expected rows [N, ...], got a 0-d tensor")
    if not isinstance(split_sizes, torch.Tensor):
        split_sizes = torch.tensor(list(split_sizes), dtype=torch.int64)
    if split_sizes.dim() != 1 or split_sizes.shape[0] % world != 0:
        raise ValueError(
            f"split_sizes: expected [E] with E (the number of experts) divisible by the "
            f"group size {world}, got shape {list(split_sizes.shape)}"
        )
    local_experts = split_sizes.shape[0] // world
    counts = split_sizes.to(device=x_sorted.device, dtype=torch.int64)
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


def combine(y_local: torch.Tensor, handle: DispatchHandle) -> torch.Tensor:
    """Send the expert outputs back where ``dispatch`` took their rows from.

    Args:
        y_local: [M, ...] rows in ``dispatch``'s x_local order (the trailing dims may
            differ from x_sorted's).
        handle: the ``dispatch`` that produced the rows.
    Returns:
        y_sorted [N, ...] in x_sorted's row order (ready for ``fuseops.moe.unpermute``).
    """
    if y_local.dim() == 0 or y_local.shape[0] != sum(handle.recv_splits):
        raise ValueError(
            f"y_local: expected the {sum(handle.recv_splits)} rows dispatch delivered to this rank, "
            f"got shape {list(y_local.shape)}"
        )
    return _Exchange.apply(y_local, handle, False)


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
