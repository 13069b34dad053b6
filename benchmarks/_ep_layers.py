"""The expert-parallel MoE layers that ``benchmarks/expert_parallel.py`` times on each rank: the
single-GPU reference (all experts, no exchange), plain torch EP (counts read on the host, a
variable-size ``all_to_all_single`` each way, ``torch._grouped_mm`` experts) and fuseops' exact
(in one piece, or overlapped: the own rows at once, the remote rows in pieces), capacity and chunked
exchanges around the same local experts."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fuseops
from fuseops import ops
from fuseops.moe import combine, dispatch, dispatch_chunks, expert_layer, permute, unpermute

# As many routings as warm-up steps: the timed steps see none for the first time.
ROUTINGS = 3
REFERENCE, TORCH_EP, CAPACITY, GRAPHED = "one-GPU", "torch EP", "fuseops EP capacity", "fuseops EP capacity, graphed"
# The exact exchange in one piece; in pieces, the own rows first (``dispatch_chunks`` without capacity).
EXACT, OVERLAP = "fuseops EP exact", "fuseops EP overlap"


def _experts(w1: torch.Tensor, w2: torch.Tensor) -> fuseops.Sequential:
    """SwiGLU experts on w1 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I]."""
    num_experts, two_i, hidden = w1.shape
    fc1 = ops.GroupedLinear(num_experts, hidden, two_i, device="meta")
    fc2 = ops.GroupedLinear(num_experts, two_i // 2, hidden, device="meta")
    fc1.weight, fc2.weight = torch.nn.Parameter(w1), torch.nn.Parameter(w2)
    return fuseops.Sequential(fc1, ops.SwiGLU(), fc2)


def _routing(tokens: int, num_experts: int, top_k: int, seed: int, skewed: bool, device: torch.device,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ids and softmax weights [T, K] of random logits; ``skewed``: every even-numbered
    token's top-1 slot then goes to expert 0, the slot that held expert 0 taking the old top-1
    expert (a token's experts stay distinct)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    top, ids = torch.randn(tokens, num_experts, device=device, generator=gen).topk(top_k, dim=-1)
    if skewed:
        even = ids[::2]
        even.copy_(torch.where(even == 0, even[:, :1], even))
        even[:, 0] = 0
    return ids, top.softmax(-1).to(dtype)


@dataclass
class Layer:
    """One rank's tokens, routings and experts at one token count: ``full`` holds all E experts
    (the one-GPU layer), ``local`` copies of this rank's E/P (the EP layers)."""

    x: torch.Tensor
    dy: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    routings: list[tuple[torch.Tensor, torch.Tensor]]
    full: fuseops.Sequential
    local: fuseops.Sequential
    mine: slice
    group: dist.ProcessGroup
    handle: object = None

    @property
    def num_experts(self) -> int:
        return self.full[0].weight.shape[0]

    def route(self, step: int) -> None:
        ids, weights = self.routings[step % len(self.routings)]
        with torch.no_grad():
            self.ids.copy_(ids)
            self.weights.copy_(weights)

    def leaves(self) -> list[torch.Tensor]:
        return [self.x, self.weights, *self.full.parameters(), *self.local.parameters()]


def make_layer(tokens: int, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device,
               skewed: bool) -> Layer:
    num_experts, hidden, ffn, top_k = shape
    rank, world = dist.get_rank(), dist.get_world_size()
    # The same weights on every rank (seed 0), each rank its own tokens and routings.
    gen = torch.Generator(device=device).manual_seed(0)
    w1 = torch.randn(num_experts, 2 * ffn, hidden, device=device, generator=gen).to(dtype) / math.sqrt(hidden)
    w2 = torch.randn(num_experts, hidden, ffn, device=device, generator=gen).to(dtype) / math.sqrt(ffn)
    gen.manual_seed(1 + rank)
    x = torch.randn(tokens, hidden, device=device, generator=gen).to(dtype).requires_grad_()
    dy = torch.randn(tokens, hidden, device=device, generator=gen).to(dtype)
    routings = [_routing(tokens, num_experts, top_k, 1000 * (rank + 1) + i, skewed, device, dtype)
                for i in range(ROUTINGS)]
    mine = slice(rank * num_experts // world, (rank + 1) * num_experts // world)
    return Layer(x, dy, routings[0][0].clone(), routings[0][1].clone().requires_grad_(), routings,
                 _experts(w1, w2), _experts(w1[mine].clone(), w2[mine].clone()), mine, dist.group.WORLD)


class _AllToAll(torch.autograd.Function):
    """A variable-size all-to-all of rows (host split sizes); its backward is the reverse one."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        out_splits, in_splits = ctx.splits
        return _all_to_all(dy, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def torch_ep(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
             num_experts: int, group: dist.ProcessGroup) -> torch.Tensor:
    """The EP layer in plain torch: x [T, H], ids and weights [T, K], this rank's experts' w1
    [E/P, 2I, H] and w2 [E/P, H, I]; rank r owns experts [r * E/P, (r + 1) * E/P)."""
    world, local, top_k = dist.get_world_size(group), w1.shape[0], ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // top_k
    counts = torch.zeros(num_experts, device=x.device, dtype=torch.int64).scatter_add_(0, flat, torch.ones_like(flat))
    # recv_counts[s * E/P + e]: the rows rank s sends to this rank's local expert e.
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    host = torch.cat([counts, recv_counts]).tolist()
    sent, received = host[:num_experts], host[num_experts:]
    send_splits = [sum(sent[r * local:(r + 1) * local]) for r in range(world)]
    recv_splits = [sum(received[s * local:(s + 1) * local]) for s in range(world)]
    rows = sum(recv_splits)
    # Arrived by source rank, then local expert; the experts want them by local expert.
    x_recv = _AllToAll.apply(x[token], recv_splits, send_splits, group)
    expert_of_row = torch.arange(local, device=x.device).repeat(world).repeat_interleave(recv_counts, output_size=rows)
    by_expert = torch.argsort(expert_of_row, stable=True)
    back = torch.empty_like(by_expert).scatter_(0, by_expert, torch.arange(rows, device=x.device))
    offs = torch.cumsum(recv_counts.view(world, local).sum(0), 0).to(torch.int32)
    h = torch._grouped_mm(x_recv[by_expert], w1.transpose(1, 2), offs=offs)
    gate, up = h.chunk(2, dim=-1)
    y_local = torch._grouped_mm(F.silu(gate) * up, w2.transpose(1, 2), offs=offs)
    y_sorted = _AllToAll.apply(y_local[back], send_splits, recv_splits, group)
    y = y_sorted * weights.reshape(-1)[order, None]
    return torch.zeros_like(x).index_add_(0, token, y)


def fuseops_ep(layer: Layer, *, capacity: int | None = None, chunks: int | None = None
               ) -> Callable[[], torch.Tensor]:
    """The EP layer of fuseops' public pieces: ``dispatch`` without ``chunks``, else
    ``dispatch_chunks`` (exact without ``capacity``: the own rows at once, the remote rows in
    ``chunks`` pieces); the exchange's handle is kept in ``layer.handle``."""

    def forward() -> torch.Tensor:
        x_sorted, split_sizes, row_map = permute(layer.x, layer.ids, layer.num_experts)
        if chunks is not None:
            drop = {} if capacity is None else {"on_overflow": "drop"}
            arrived, handle = dispatch_chunks(x_sorted, split_sizes, layer.group, capacity=capacity, chunks=chunks,
                                              **drop)
            # A generator: each piece's return exchange starts as its output comes (overlap).
            y_local = (layer.local(x_k, splits_k, splits_k) for x_k, splits_k in arrived)
        else:
            exchange = {} if capacity is None else {"capacity": capacity, "on_overflow": "drop"}
            x_local, local_splits, handle = dispatch(x_sorted, split_sizes, layer.group, **exchange)
            y_local = layer.local(x_local, local_splits, local_splits)
        layer.handle = handle
        return unpermute(combine(y_local, handle), row_map, layer.weights)

    return forward


def implementations(layer: Layer, capacity: int, chunks: tuple[int, ...], pieces: tuple[int, ...] = ()
                    ) -> dict[str, Callable[[], torch.Tensor]]:
    """Each row's forward (the reference first, plain torch EP second: the others' ratios use them);
    ``pieces``: the overlapped exact rows' remote pieces, ``chunks``: the capacity rows' chunks."""

    def reference() -> torch.Tensor:
        x_sorted, split_sizes, row_map = permute(layer.x, layer.ids, layer.num_experts)
        return unpermute(layer.full(x_sorted, split_sizes, split_sizes), row_map, layer.weights)

    impls = {
        REFERENCE: reference,
        TORCH_EP: lambda: torch_ep(layer.x, layer.ids, layer.weights, layer.local[0].weight, layer.local[2].weight,
                                   layer.num_experts, layer.group),
        "one-GPU expert_layer": lambda: expert_layer(layer.x, layer.ids, layer.weights, layer.full),
        EXACT: fuseops_ep(layer),
    }
    for k in pieces:
        impls[f"{OVERLAP}={k}"] = fuseops_ep(layer, chunks=k)
    impls[CAPACITY] = fuseops_ep(layer, capacity=capacity)
    for k in chunks:
        if 1 < k <= capacity:
            impls[f"fuseops EP chunks={k}"] = fuseops_ep(layer, capacity=capacity, chunks=k)
    return impls
