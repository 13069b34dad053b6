"""MoE routing: group token rows by expert (``permute``) and combine the top-k expert
outputs back per token, weighted (``unpermute``), plus the combine's backward.

Shapes: ``x`` [T, H] and ``expert_ids`` [T, K] -> ``x_sorted`` [T*K, H] (one row per
(token, choice), grouped by expert ascending, stable), ``split_sizes`` [E] int64 and
``row_map`` [T, K] int64 (where each (token, choice) row went). ``unpermute`` takes
``y_sorted`` [T*K, H], ``row_map`` and ``weights`` [T, K] back to ``y`` [T, H].
Tiling: routing entries (the T*K flat ids) in blocks of BLOCK: a histogram per block, a
prefix sum per expert down the blocks, then each entry's row is its expert's start + its
block's prefix + its rank among equal ids earlier in the block ([BLOCK, BLOCK] compare).
Data moves in [BLOCK_T tokens, BLOCK_H features] tiles, the K rows of a token in an inner
loop: the scatter reads each token row once, the gather writes each output row once
(no atomics, so results are bitwise repeatable). No host sync: the routing stays on the
device and every size is static, so all of it captures in a CUDA graph.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, next_power_of_2
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.launch import launch


@dataclass(frozen=True)
class PermuteConfig:
    # Routing entries per histogram / rank program (the rank compares BLOCK x BLOCK).
    block: int
    # Tile of the per-expert prefix sum: [block_b blocks, block_e experts].
    block_b: int
    block_e: int
    # Tile of the row copies: [block_t tokens, block_h features].
    block_t: int
    block_h: int
    num_warps: int


@functools.cache
def _configs() -> PermuteConfig:
    """Under the interpreter, tiny tiles give several programs and loop trips on test
    shapes. The GPU values are not tuned yet: a 128-entry block keeps the rank compare at
    16K lanes, and an [8, 512] bf16 copy tile is 64 bytes per thread;
    ``benchmarks/moe_permute.py --tune`` is the measurement to retune them with."""
    if INTERPRET:
        return PermuteConfig(block=16, block_b=4, block_e=4, block_t=16, block_h=64, num_warps=1)
    return PermuteConfig(block=128, block_b=256, block_e=16, block_t=8, block_h=512, num_warps=4)


@triton.jit
def _expert(ids, offs, mask, E):
    # Out-of-range ids fail loudly (moe/routing.py: a host check, or a device-side assert on
    # CUDA, on the flag the count kernel sets); the clamp keeps every access in bounds until
    # it reports.
    e = tl.load(ids + offs, mask=mask, other=0)
    # Clamped in the ids' own dtype, then narrowed: an int64 id past 2**31 lands on E - 1 as
    # in the reference, never wrapped into range.
    return tl.minimum(tl.maximum(e, 0), E - 1).to(tl.int32)


@triton.jit
def _flag_out_of_range(values, mask, bound, ok):
    # Any value outside [0, bound) under ``mask`` sets ``*ok`` to 0 (the caller asserts on it;
    # compared in the values' own dtype, so an int64 id is never wrapped into range).
    bad = tl.sum((((values < 0) | (values >= bound)) & mask).to(tl.int32), 0)
    tl.store(ok, 0, mask=bad > 0)


@triton.jit
def permute_count_kernel(ids, counts, n, E, ids_ok, E_PAD: tl.constexpr, BLOCK: tl.constexpr,
                         CHECK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if CHECK:
        _flag_out_of_range(tl.load(ids + offs, mask=mask, other=0), mask, E, ids_ok)
    hist = tl.histogram(_expert(ids, offs, mask, E), E_PAD, mask=mask)
    offs_e = tl.arange(0, E_PAD)
    tl.store(counts + pid * E + offs_e, hist, mask=offs_e < E)


@triton.jit
def permute_scan_kernel(counts, split_sizes, blocks, E, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr):
    # In place: counts[b, e] becomes the number of ids e in blocks before b.
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    mask_e = offs_e < E
    carry = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for b0 in range(0, blocks, BLOCK_B):
        offs_b = b0 + tl.arange(0, BLOCK_B)
        mask = (offs_b < blocks)[:, None] & mask_e[None, :]
        ptrs = counts + offs_b[:, None] * E + offs_e[None, :]
        # [BLOCK_B, BLOCK_E]
        c = tl.load(ptrs, mask=mask, other=0)
        tl.store(ptrs, tl.cumsum(c, 0) - c + carry[None, :], mask=mask)
        carry += tl.sum(c, 0)
    tl.store(split_sizes + offs_e, carry.to(tl.int64), mask=mask_e)


@triton.jit
def permute_rows_kernel(
    ids, prefix, split_sizes, row_map, n, E, E_PAD: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    e = _expert(ids, offs, mask, E)
    # Stable: the rank counts equal ids at smaller flat indices only. Masked lanes sit
    # after every real one, so they never count.
    earlier = (e[None, :] == e[:, None]) & (offs[None, :] < offs[:, None])
    rank = tl.sum(earlier.to(tl.int32), 1)
    offs_e = tl.arange(0, E_PAD)
    sizes = tl.load(split_sizes + offs_e, mask=offs_e < E, other=0)
    # An expert's first row is the sum of the sizes before it.
    start = tl.gather(tl.cumsum(sizes, 0) - sizes, e, 0)
    before = tl.load(prefix + pid * E + e, mask=mask, other=0)
    tl.store(row_map + offs, start + before + rank, mask=mask)


@triton.jit
def scatter_rows_kernel(
    src, row_map, weights, dst, y_sorted, dweights, T, H, top_k, stride_src,
    HAS_WEIGHTS: tl.constexpr, WANT_DW: tl.constexpr, K_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # dst[row_map[t, k]] = weights[t, k] * src[t]; with WANT_DW also
    # dweights[t, k] = <src[t], y_sorted[row_map[t, k]]>. src's rows are stride_src apart
    # (a column slice of a wider tensor is read in place).
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < T
    offs_k = tl.arange(0, K_PAD)
    dw = tl.zeros((BLOCK_T, K_PAD), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask = mask_t[:, None] & (offs_h < H)[None, :]
        # [BLOCK_T, BLOCK_H]
        s = tl.load(src + offs_t[:, None].to(tl.int64) * stride_src + offs_h[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        for k in range(top_k):
            rows = tl.load(row_map + offs_t * top_k + k, mask=mask_t, other=0)
            ptrs = rows[:, None] * H + offs_h[None, :]
            val = s
            if HAS_WEIGHTS:
                val = s * tl.load(weights + offs_t * top_k + k, mask=mask_t, other=0.0).to(tl.float32)[:, None]
            tl.store(dst + ptrs, val.to(dst.dtype.element_ty), mask=mask)
            if WANT_DW:
                # [BLOCK_T, BLOCK_H]
                ys = tl.load(y_sorted + ptrs, mask=mask, other=0.0).to(tl.float32)
                dw += tl.where(offs_k[None, :] == k, tl.sum(s * ys, 1)[:, None], 0.0)
    if WANT_DW:
        mask_dw = mask_t[:, None] & (offs_k < top_k)[None, :]
        ptrs_dw = dweights + offs_t[:, None] * top_k + offs_k[None, :]
        tl.store(ptrs_dw, dw.to(dweights.dtype.element_ty), mask=mask_dw)


@triton.jit
def gather_rows_kernel(
    src, row_map, weights, dst, T, H, top_k, rows_ok,
    HAS_WEIGHTS: tl.constexpr, CHECK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # dst[t] = sum_k weights[t, k] * src[row_map[t, k]], in float32. Rows are clamped into
    # src's T*K rows, so a bad row_map reads nothing out of bounds until its assert reports.
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    mask_t = offs_t < T
    n_rows = T * top_k
    if CHECK:
        for k in range(top_k):
            _flag_out_of_range(tl.load(row_map + offs_t * top_k + k, mask=mask_t, other=0), mask_t, n_rows,
                               rows_ok)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask = mask_t[:, None] & (offs_h < H)[None, :]
        acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
        for k in range(top_k):
            rows = tl.load(row_map + offs_t * top_k + k, mask=mask_t, other=0)
            rows = tl.minimum(tl.maximum(rows, 0), n_rows - 1)
            # [BLOCK_T, BLOCK_H]
            g = tl.load(src + rows[:, None] * H + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_WEIGHTS:
                g *= tl.load(weights + offs_t * top_k + k, mask=mask_t, other=0.0).to(tl.float32)[:, None]
            acc += g
        tl.store(dst + offs_t[:, None].to(tl.int64) * H + offs_h[None, :], acc.to(dst.dtype.element_ty), mask=mask)


def _copy_grid(T: int, cfg: PermuteConfig) -> tuple[int]:
    # At least one program, so empty inputs still launch (and store nothing).
    return (max(1, cdiv(T, cfg.block_t)),)


def permute(
    x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int, *, out: torch.Tensor | None = None,
    ids_ok: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of ``x`` grouped by expert, stable, with the routing on the device.

    Args:
        x: [T, H] float, contiguous.
        expert_ids: [T, K] any integer dtype, contiguous, in [0, num_experts) (the caller
            checks; out-of-range ids are clamped here so nothing is accessed out of bounds).
        num_experts: E.
        out: [T*K, H] in ``x``'s dtype for ``x_sorted``, written and returned; else allocated.
        ids_ok: a one-element int32 tensor on ``x``'s device, set to 0 when an id lies outside
            [0, num_experts) and left as it is otherwise: the range check in the count kernel,
            for the caller's ``torch._assert_async`` (moe/routing.py).
    Returns:
        ``(x_sorted, split_sizes, row_map)``: [T*K, H], [E] int64, [T, K] int64.
    """
    cfg = _configs()
    T, H = x.shape
    top_k = expert_ids.shape[1]
    x = x if x.stride(1) == 1 else x.contiguous()  # the copy reads each row as one run
    n = T * top_k
    blocks = max(1, cdiv(n, cfg.block))
    e_pad = next_power_of_2(num_experts)
    ids = expert_ids.reshape(-1)
    counts = torch.empty(blocks, num_experts, dtype=torch.int32, device=x.device)
    split_sizes = torch.empty(num_experts, dtype=torch.int64, device=x.device)
    row_map = torch.empty(T, top_k, dtype=torch.int64, device=x.device)
    x_sorted = out if out is not None else torch.empty(n, H, dtype=x.dtype, device=x.device)
    launch(permute_count_kernel, (blocks,),
        ids, counts, n, num_experts, ids_ok, E_PAD=e_pad, BLOCK=cfg.block, CHECK=ids_ok is not None,
        num_warps=cfg.num_warps,
    )
    launch(permute_scan_kernel, (cdiv(num_experts, cfg.block_e),),
        counts, split_sizes, blocks, num_experts,
        BLOCK_B=cfg.block_b, BLOCK_E=cfg.block_e, num_warps=cfg.num_warps,
    )
    launch(permute_rows_kernel, (blocks,),
        ids, counts, split_sizes, row_map, n, num_experts,
        E_PAD=e_pad, BLOCK=cfg.block, num_warps=cfg.num_warps,
    )
    if H:  # no columns: the routing alone (the quantized expert layer's)
        launch(scatter_rows_kernel, _copy_grid(T, cfg),
            x, row_map, None, x_sorted, None, None, T, H, top_k, x.stride(0),
            HAS_WEIGHTS=False, WANT_DW=False, K_PAD=1,
            BLOCK_T=cfg.block_t, BLOCK_H=cfg.block_h, num_warps=cfg.num_warps,
        )
    return x_sorted, split_sizes, row_map


def unpermute(
    y_sorted: torch.Tensor,
    row_map: torch.Tensor,
    weights: torch.Tensor | None,
    *,
    out: torch.Tensor | None = None,
    rows_ok: torch.Tensor | None = None,
) -> torch.Tensor:
    """The top-k rows of each token summed back, weighted, in float32.

    Args:
        y_sorted: [T*K, H] float, contiguous.
        row_map: [T, K] int64 from ``permute``, contiguous (rows are clamped into
            [0, T*K), so a bad one reads nothing out of bounds).
        weights: [T, K] float (any float dtype), contiguous; None means all ones.
        out: [T, H] in ``y_sorted``'s dtype, written and returned; else allocated.
        rows_ok: a one-element int32 tensor on the device, set to 0 when a row lies outside
            [0, T*K) and left as it is otherwise (as ``permute``'s ``ids_ok``).
    """
    cfg = _configs()
    T, top_k = row_map.shape
    H = y_sorted.shape[1]
    y = out if out is not None else torch.empty(T, H, dtype=y_sorted.dtype, device=y_sorted.device)
    launch(gather_rows_kernel, _copy_grid(T, cfg),
        y_sorted, row_map, weights, y, T, H, top_k, rows_ok,
        HAS_WEIGHTS=weights is not None, CHECK=rows_ok is not None, BLOCK_T=cfg.block_t, BLOCK_H=cfg.block_h,
        num_warps=cfg.num_warps,
    )
    return y


def unpermute_bwd(
    dy: torch.Tensor,
    row_map: torch.Tensor,
    weights: torch.Tensor | None,
    y_sorted: torch.Tensor | None,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of ``unpermute``: ``dy_sorted`` always, ``dweights`` when ``y_sorted``
    (the forward's input) is given.

    Args:
        dy: [T, H] float, each row contiguous (rows any stride apart: a column slice of a
            wider tensor is read in place).
        row_map: [T, K] int64 from ``permute`` (a permutation of the rows), contiguous.
        weights: [T, K] float, contiguous, or None for all ones.
        y_sorted: [T*K, H] like the forward's, contiguous, or None.
        out: [T*K, H] in ``dy``'s dtype for ``dy_sorted``, written and returned; else allocated.
    Returns:
        ``(dy_sorted, dweights)``: [T*K, H] in ``dy``'s dtype; [T, K] in ``weights``' dtype
        (``dy``'s without weights) or None.
    """
    cfg = _configs()
    T, top_k = row_map.shape
    H = dy.shape[1]
    dy = dy if dy.stride(1) == 1 else dy.contiguous()  # the copy reads each row as one run
    dy_sorted = out if out is not None else torch.empty(T * top_k, H, dtype=dy.dtype, device=dy.device)
    dweights = None
    if y_sorted is not None:
        dw_dtype = weights.dtype if weights is not None else dy.dtype
        dweights = torch.empty(T, top_k, dtype=dw_dtype, device=dy.device)
    launch(scatter_rows_kernel, _copy_grid(T, cfg),
        dy, row_map, weights, dy_sorted, y_sorted, dweights, T, H, top_k, dy.stride(0),
        HAS_WEIGHTS=weights is not None, WANT_DW=y_sorted is not None,
        K_PAD=next_power_of_2(top_k), BLOCK_T=cfg.block_t, BLOCK_H=cfg.block_h,
        num_warps=cfg.num_warps,
    )
    return dy_sorted, dweights


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _flag_out_of_range_reference(values: torch.Tensor, bound: int, ok: torch.Tensor | None) -> None:
    if ok is not None:
        ok.mul_(((values >= 0) & (values < bound)).all())


def reference_permute(
    x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int, *, out: torch.Tensor | None = None,
    ids_ok: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """With ``i = t*K + k`` the flat index of (token t, choice k) and ``e_i`` its expert
    (clamped into [0, E)):

    ``split_sizes[e] = #{i : e_i = e}``; ``row_map[t, k] = sum_{e < e_i} split_sizes[e]
    + #{j < i : e_j = e_i}`` (stable: equal experts keep flat order); and
    ``x_sorted[row_map[t, k]] = x[t]``. A stable argsort of the ids is the inverse of
    ``row_map``."""
    T, top_k = expert_ids.shape
    _flag_out_of_range_reference(expert_ids, num_experts, ids_ok)
    flat = expert_ids.reshape(-1).long().clamp(0, num_experts - 1)
    order = torch.argsort(flat, stable=True)
    row_map = torch.empty_like(order)
    row_map[order] = torch.arange(order.numel(), device=x.device)
    # index_add_ rather than bincount: bincount reads the largest id back to the host.
    split_sizes = torch.zeros(num_experts, dtype=torch.int64, device=x.device)
    split_sizes.index_add_(0, flat, torch.ones_like(flat))
    x_sorted = x.index_select(0, order // top_k)
    return (out.copy_(x_sorted) if out is not None else x_sorted), split_sizes, row_map.view(T, top_k)


def reference_unpermute(
    y_sorted: torch.Tensor,
    row_map: torch.Tensor,
    weights: torch.Tensor | None,
    *,
    out: torch.Tensor | None = None,
    rows_ok: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y[t] = sum_k weights[t, k] * y_sorted[row_map[t, k]]`` in float32 (float64 for
    float64 inputs), cast to ``y_sorted``'s dtype; ``weights=None`` is all ones; rows clamped
    into [0, T*K) as the kernel's."""
    T, top_k = row_map.shape
    acc = _acc_dtype(y_sorted.dtype)
    _flag_out_of_range_reference(row_map, T * top_k, rows_ok)
    g = y_sorted.index_select(0, row_map.reshape(-1).clamp(0, T * top_k - 1)).view(T, top_k, y_sorted.shape[1]).to(acc)
    if weights is not None:
        g = g * weights.to(acc)[..., None]
    y = g.sum(1)
    return out.copy_(y) if out is not None else as_dtype(y, y_sorted.dtype)


def reference_unpermute_bwd(
    dy: torch.Tensor,
    row_map: torch.Tensor,
    weights: torch.Tensor | None,
    y_sorted: torch.Tensor | None,
    *,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dy_sorted[row_map[t, k]] = weights[t, k] * dy[t]`` and
    ``dweights[t, k] = <dy[t], y_sorted[row_map[t, k]]>``, both in float32 (float64 for
    float64 inputs); ``dweights`` only when ``y_sorted`` is given."""
    T, top_k = row_map.shape
    H = dy.shape[1]
    acc = _acc_dtype(dy.dtype)
    flat = row_map.reshape(-1)
    dyf = dy.to(acc)[:, None, :].expand(T, top_k, H)
    vals = dyf * weights.to(acc)[..., None] if weights is not None else dyf
    vals = vals.reshape(T * top_k, H).to(dy.dtype if out is None else out.dtype)
    # Out of place where no ``out`` is given: a batched cotangent (torch's vmap) cannot be
    # written into an unbatched buffer.
    dy_sorted = out.index_put_((flat,), vals) if out is not None else torch.empty(
        T * top_k, H, dtype=dy.dtype, device=dy.device).index_put((flat,), vals)
    dweights = None
    if y_sorted is not None:
        ys = y_sorted.index_select(0, flat).view(T, top_k, H).to(acc)
        dweights = as_dtype((dyf * ys).sum(-1), weights.dtype if weights is not None else dy.dtype)
    return dy_sorted, dweights
