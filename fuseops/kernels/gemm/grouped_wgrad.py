"""Grouped GEMM weight and bias gradients: reductions over each group's rows.

``dw[g] = dy[rows of g]^T @ x[rows of g]`` with ``dy`` [M, N], ``x`` [M, K], ``dw`` [G, N, K]
(optionally added in float32 into ``main_grad``), and ``db[g] = sum of dy[rows of g]`` [G, N].
Empty groups give exact zeros. The sums run in float32 and are rounded once, to dw's dtype:
a float32 dw from bf16 operands (a float32 parameter under ``torch.autocast``) keeps the
float32 sum, with no bf16 copy and no cast pass after. With ``x_rows`` the grouped rows of
``x`` are gathered in the loads, ``x[x_rows[i]]`` for row i (the MoE layer's permuted input,
never materialised), and with ``dy_rows`` those of ``dy`` (its per-token output gradient).

On sm_90, bf16 / fp16 operands behind TMA take the warp-specialized Gluon kernel of
hopper/wgrad.py; everything else (and every gathered operand: TMA on sm_90 cannot gather
rows) runs the Triton kernel here.

Tiling: a persistent grid of one program per SM walks the [BLOCK_N, BLOCK_K] tiles of all
``dw[g]``, a group's tiles consecutive, along K or N first (gemm/wgrad_walk.py: whichever makes a
wave read fewer columns of dy and x); each reduces over its group's rows in BLOCK_M slabs,
loaded through ragged TMA descriptors that read zeros past the group's end (masked pointer
loads when unaligned). The bias gradient walks [G, BLOCK_N] column strips the same way, in a
fixed order (deterministic).
"""

from __future__ import annotations

import functools
import itertools

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET, cdiv, dot, float32_dot_precision, float32_matmul_in_tf32
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.gemm.grouped import (
    GemmConfig,
    autograd_sees,
    persistent_programs,
    ragged_descriptor,
    ragged_load,
    tma_ok,
    torch_grouped_mm_serves,
)
from fuseops.kernels.gemm.wgrad_walk import n_fastest, wgrad_tile
from fuseops.kernels.launch import launch


@functools.cache
def _configs() -> dict[str, GemmConfig]:
    """Tile shapes by shape class; ``block_m`` is the reduction slab over rows. 16-bit operands
    behind TMA: ``store``, and ``accumulate`` (a float32 tile in the epilogue: ``main_grad``
    read and written, or a float32 ``dw`` written; a narrower tile); ``pointer`` for unaligned
    16-bit operands; float32 operands in IEEE (``fp32``) and in TF32 (``tf32``, under torch's
    TF32 setting).

    ``store`` and ``accumulate`` were chosen on an H100 by ``python -m benchmarks.grouped_gemm
    --tune`` (bf16, the four MoE shapes x uniform/skewed routing): 1.03x torch._grouped_mm
    and 1.18x grouped_mm + ``main_grad.add_`` in geometric mean; flatten=False edges out the
    flattened loop in both. ``pointer``
    is the largest tile that compiles for sm_90 without spills (ptxas, not timed). ``gathered x``
    and ``gathered dy`` (that operand's rows read through a row map, which the reduction runs
    over) were chosen on an H200 (``python -m benchmarks.gathered_gemm``,
    benchmarks/results/gathered_gemm-h200-2026-11-29.json; FC1's weight gradient gathers x, FC2's
    dy): over the five MoE shapes, uniform and skewed, 0.55-0.75x and 0.54-0.64x the TMA kernel
    on a copy; the wider dy tile (dy is the N side) for gathered x, the wider x tile for gathered
    dy. Triton 3.6 keeps at most three slabs in flight when the row indices take a pipeline
    stage of their own. ``fp32`` /
    ``tf32`` were timed on an H100 (E=64, M=32768, N=1408, K=2048, uniform, float32 dw;
    ``benchmarks/float32_precision.py``): 4.4 ms in IEEE (1.26x a per-expert torch.mm loop; a
    32x64x64 tile, 7.8 ms), 3.7 ms in TF32 (0.63x the loop, which TF32 speeds 2.4x; the
    32x64x64 tile 7.7 ms).
    """
    if INTERPRET:
        small = GemmConfig(32, 32, 32, 1, 4, 1)
        return {"store": small, "accumulate": small, "pointer": small, "gathered x": small, "gathered dy": small,
                "fp32": small, "tf32": small}
    return {
        "store": GemmConfig(64, 128, 256, 1, 8, 3, flatten=False),
        "accumulate": GemmConfig(64, 128, 128, 1, 8, 4, flatten=False),
        "pointer": GemmConfig(64, 128, 128, 1, 8, 3),
        "gathered x": GemmConfig(64, 256, 128, 1, 8, 5, flatten=False),
        "gathered dy": GemmConfig(64, 128, 256, 1, 8, 5, flatten=False),
        "fp32": GemmConfig(64, 128, 128, 1, 8, 2),
        "tf32": GemmConfig(32, 256, 128, 1, 8, 2),
    }


def pick_wgrad_config(dtype: torch.dtype, tma: bool, float32_dw: bool, gathered: str | None = None) -> GemmConfig:
    """The table entry for operands of ``dtype``; ``float32_dw``: the epilogue handles a
    float32 tile (``main_grad``, or a float32 ``dw``); ``gathered``: ``"x"`` or ``"dy"``, the
    operand whose rows are read through a row map (``"dy"`` where both are). One serves every
    M, N and K of the MoE shapes measured."""
    if gathered not in (None, "x", "dy"):
        raise ValueError(f"gathered={gathered!r}: expected None, 'x' or 'dy'")
    if dtype == torch.float32:
        return _configs()["tf32" if float32_matmul_in_tf32() else "fp32"]
    if gathered is not None:
        return _configs()[f"gathered {gathered}"]
    if not tma:
        return _configs()["pointer"]
    return _configs()["accumulate" if float32_dw else "store"]


@triton.jit
def grouped_gemm_wgrad_kernel(
    dy, x, dw, offsets, x_rows, dy_rows,
    G, N, K,
    stride_dym, stride_xm, stride_dwg, stride_dwn,
    ACCUMULATE: tl.constexpr, TMA_LOAD: tl.constexpr, X_GATHER: tl.constexpr, DY_GATHER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
    N_FASTEST: tl.constexpr, F32_DOT: tl.constexpr,
):
    # Tiles of one group are consecutive, so a wave shares the group's rows of dy and x in L2.
    tiles_n, tiles_k = tl.cdiv(N, BLOCK_N), tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), G * tiles_n * tiles_k, NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        g, pid_n, pid_k = wgrad_tile(tile, tiles_n, tiles_k, N_FASTEST)
        row0 = tl.load(offsets + g)
        size = (tl.load(offsets + g + 1) - row0).to(tl.int32)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_n = offs_n < N
        mask_k = offs_k < K
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for r in range(tl.cdiv(size, BLOCK_M)):
            if TMA_LOAD:
                dy_tile = ragged_load(dy, row0, size, r * BLOCK_M, pid_n * BLOCK_N, BLOCK_M, BLOCK_N)
                x_tile = ragged_load(x, row0, size, r * BLOCK_M, pid_k * BLOCK_K, BLOCK_M, BLOCK_K)
            else:
                offs_r = r * BLOCK_M + tl.arange(0, BLOCK_M)
                rows = row0 + offs_r
                mask_r = offs_r < size
                if DY_GATHER:
                    dy_src = tl.load(dy_rows + rows, mask=mask_r, other=0)
                else:
                    dy_src = rows
                dy_ptrs = dy + dy_src[:, None] * stride_dym + offs_n[None, :]
                # [BLOCK_M, BLOCK_N]
                dy_tile = tl.load(dy_ptrs, mask=mask_r[:, None] & mask_n[None, :], other=0.0)
                if X_GATHER:
                    # Row i of the grouped x is x[x_rows[i]]: one index load per slab row.
                    x_src = tl.load(x_rows + rows, mask=mask_r, other=0)
                else:
                    x_src = rows
                x_ptrs = x + x_src[:, None] * stride_xm + offs_k[None, :]
                # [BLOCK_M, BLOCK_K]
                x_tile = tl.load(x_ptrs, mask=mask_r[:, None] & mask_k[None, :], other=0.0)
            acc = dot(tl.trans(dy_tile), x_tile, acc, F32_DOT)
        # Pointers built after the reduction: a [BLOCK_N, BLOCK_K] pointer tile live across it
        # costs 128 registers and spills.
        dw_ptrs = dw + g.to(tl.int64) * stride_dwg + offs_n[:, None] * stride_dwn + offs_k[None, :]
        mask = mask_n[:, None] & mask_k[None, :]
        if ACCUMULATE:
            # main_grad plus the finished sum, as every other wgrad (and ``main_grad.add_``)
            # adds it: a reduction started from main_grad rounds each micro-batch's gradient
            # into the sum so far, so two micro-batches were not twice one.
            acc += tl.load(dw_ptrs, mask=mask, other=0.0)
        tl.store(dw_ptrs, acc.to(dw.dtype.element_ty), mask=mask)


@triton.jit
def grouped_bias_grad_kernel(
    dy, db, offsets, G, N, stride_dym, stride_dbg,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), G * tiles_n, NUM_PROGRAMS):
        g = tile // tiles_n
        offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        row0 = tl.load(offsets + g)
        size = (tl.load(offsets + g + 1) - row0).to(tl.int32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for r in range(0, size, BLOCK_M):
            offs_r = r + tl.arange(0, BLOCK_M)
            ptrs = dy + (row0 + offs_r)[:, None] * stride_dym + offs_n[None, :]
            # [BLOCK_M, BLOCK_N]
            acc += tl.load(ptrs, mask=(offs_r < size)[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        tl.store(db + g * stride_dbg + offs_n, tl.sum(acc, 0).to(db.dtype.element_ty), mask=mask_n)


def grouped_gemm_wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    offsets: torch.Tensor,
    *,
    main_grad: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    x_rows: torch.Tensor | None = None,
    dy_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-group ``dy^T @ x`` (module docstring).

    Args:
        dy: [M, N] and x: [M, K], rows grouped contiguously by ``offsets``.
        offsets: int64 [G + 1] device tensor.
        main_grad: float32 [G, N, K] to accumulate into (and return), or None.
        out: [G, N, K] to write into (the float32 sums rounded to its dtype), else allocated.
        out_dtype: the dtype of the ``dw`` allocated here; default ``x``'s.
        x_rows: int64 [M] or None: row i of the grouped x is ``x[x_rows[i]]`` (``x`` then has
            any number of rows), gathered in the loads; ``dy_rows`` the same for ``dy``.
    Returns:
        ``dw`` [G, N, K], or ``main_grad`` after the accumulation.
    """
    dw_dtype = out.dtype if out is not None else out_dtype or x.dtype
    gathered = "dy" if dy_rows is not None else "x" if x_rows is not None else None
    cfg = pick_wgrad_config(x.dtype, tma_ok(dy, x) and gathered is None,
                            main_grad is not None or dw_dtype == torch.float32, gathered)
    rows = {"x_rows": x_rows, "dy_rows": dy_rows}
    # The kernels address dw with a unit last stride: other layouts go through a staging copy.
    if main_grad is not None and main_grad.stride(-1) != 1:
        return main_grad.copy_(launch_grouped_gemm_wgrad(dy, x, offsets, main_grad.contiguous(), None, cfg, **rows))
    if out is not None and out.stride(-1) != 1:
        return out.copy_(launch_grouped_gemm_wgrad(dy, x, offsets, None, None, cfg, out_dtype=out.dtype, **rows))
    return launch_grouped_gemm_wgrad(dy, x, offsets, main_grad, out, cfg, out_dtype=dw_dtype, **rows)


def launch_grouped_gemm_wgrad(dy, x, offsets, main_grad, out, cfg: GemmConfig, along_n: bool | None = None, *,
                              out_dtype: torch.dtype | None = None, x_rows: torch.Tensor | None = None,
                              dy_rows: torch.Tensor | None = None) -> torch.Tensor:
    """``grouped_gemm_wgrad`` with an explicit tile config (what the offline tuner calls) and,
    for tests, walk order (``along_n``; else wgrad_walk.n_fastest's)."""
    N, K, G = dy.shape[1], x.shape[1], offsets.shape[0] - 1
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    x = x if x.stride(1) == 1 else x.contiguous()
    if main_grad is not None:
        dw = main_grad
    else:
        dw = out if out is not None else torch.empty(G, N, K, dtype=out_dtype or x.dtype, device=x.device)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    # TMA cannot gather rows: a gathered operand takes the pointer loads (the other's too, one code path).
    tma_load = tma_ok(dy, x) and x_rows is None and dy_rows is None
    dy_arg = ragged_descriptor(dy, [bm, bn]) if tma_load else dy
    x_arg = ragged_descriptor(x, [bm, bk]) if tma_load else x
    programs = persistent_programs(x, G * cdiv(N, bn) * cdiv(K, bk), cfg.programs_per_sm)
    if along_n is None:
        along_n = n_fastest(N, K, bn, bk, programs)
    launch(grouped_gemm_wgrad_kernel, (programs,),
        dy_arg, x_arg, dw, offsets, x_rows if x_rows is not None else offsets,
        dy_rows if dy_rows is not None else offsets, G, N, K,
        dy.stride(0), x.stride(0), dw.stride(0), dw.stride(1),
        ACCUMULATE=main_grad is not None, TMA_LOAD=tma_load, X_GATHER=x_rows is not None,
        DY_GATHER=dy_rows is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
        WARP_SPECIALIZE=cfg.warp_specialize, N_FASTEST=along_n, F32_DOT=float32_dot_precision(dy.dtype),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return dw


def grouped_bias_grad(dy: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``db[g] = sum of dy[offsets[g]:offsets[g+1]]`` [G, N] in ``dy``'s dtype (float32 sums).

    Args:
        dy: [M, N], rows grouped contiguously by ``offsets`` (int64 [G + 1], on device).
    """
    M, N = dy.shape
    G = offsets.shape[0] - 1
    dy = dy if dy.stride(1) == 1 else dy.contiguous()
    db = torch.empty(G, N, dtype=dy.dtype, device=dy.device)
    block_m, block_n = (32, 32) if INTERPRET else (64, 64)
    # Memory-bound: several programs per SM hide load latency.
    programs = persistent_programs(dy, G * cdiv(N, block_n))
    programs = min(4 * programs, G * cdiv(N, block_n))
    launch(grouped_bias_grad_kernel, (max(programs, 1),),
        dy, db, offsets, G, N, dy.stride(0), db.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, NUM_PROGRAMS=max(programs, 1), num_warps=4,
    )
    return db


def reference_grouped_gemm_wgrad(
    dy: torch.Tensor,
    x: torch.Tensor,
    offsets: torch.Tensor,
    *,
    main_grad: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    x_rows: torch.Tensor | None = None,
    dy_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``dw[g] = dy[r]^T @ x[r]`` for r = offsets[g]:offsets[g+1] in float32 (zero when empty),
    rounded once to ``out``'s dtype, else ``out_dtype`` (default ``x``'s): float32 from bf16
    operands is the float32 sum itself. With ``main_grad``: ``main_grad[g] += dy[r]^T @ x[r]``,
    returned. With ``x_rows``, ``x`` stands for ``x[x_rows]``; with ``dy_rows``, ``dy`` for
    ``dy[dy_rows]``.
    """
    if x_rows is not None:
        x = x.index_select(0, x_rows)
    if dy_rows is not None:
        dy = dy.index_select(0, dy_rows)
    G, x_dtype = offsets.shape[0] - 1, x.dtype
    compute = torch.promote_types(x.dtype, torch.float32)
    dy, x = as_dtype(dy, compute), as_dtype(x, compute)
    if autograd_sees(dy, x):
        # Under torch.func (jacrev's vmap over this backward) or differentiated: no ``out=``.
        dw = torch.stack([dy[lo:hi].T @ x[lo:hi] for lo, hi in itertools.pairwise(offsets.tolist())])
    elif torch_grouped_mm_serves(x, dy.T):
        dw = torch._grouped_mm(dy.T, x, offs=offsets[1:].to(torch.int32))
    else:
        dw = _wgrad_per_group(dy, x, offsets.tolist(), G)
    if main_grad is not None:
        return main_grad.add_(dw.to(main_grad.dtype))
    if out is not None:
        return out.copy_(dw)
    return as_dtype(dw, out_dtype or x_dtype)


def _wgrad_per_group(dy: torch.Tensor, x: torch.Tensor, bounds: list[int], G: int) -> torch.Tensor:
    dw = torch.zeros(G, dy.shape[1], x.shape[1], dtype=x.dtype, device=x.device)
    for g in range(G):
        r = slice(bounds[g], bounds[g + 1])
        # In place (an empty group's product is zero): no temporary, no index-put per group.
        torch.mm(dy[r].T, x[r], out=dw[g])
    return dw


def reference_grouped_bias_grad(dy: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``db[g] = dy[offsets[g]:offsets[g+1]].sum(0)`` in float32, zero when empty, as ``dy``'s dtype."""
    compute = torch.promote_types(dy.dtype, torch.float32)
    bounds = offsets.tolist()
    sums = [dy[bounds[g] : bounds[g + 1]].to(compute).sum(0) for g in range(offsets.shape[0] - 1)]
    return as_dtype(torch.stack(sums), dy.dtype)
