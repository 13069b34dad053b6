"""Grouped GEMMs on quantized operands for mixture-of-experts, over rows grouped by device offsets.

``grouped_gemm_scaled`` (forward and dgrad): ``y[rows of g] = dequant(a[rows of g]) @
dequant(b[g])^T (+ bias[g])`` with ``a`` [M, K] (x, or dy, row-wise) and ``b`` [G, N, K] (the
weight row-wise, or its column-wise copy [G, K, N] for dgrad), both quantized along K. The
weight gradient is gemm/grouped_scaled_wgrad.py's.

Scales apply as in gemm/dense_scaled.py (float8 ``tl.dot`` for TENSOR and BLOCK; MX and NVFP4
emulated by dequantizing tiles to bf16); per-tensor scales are per group here.

Tiling: a persistent grid of one program per SM walks the [BLOCK_M, BLOCK_N] tiles of all
groups counted in-kernel from the offsets (gemm/grouped.py). Operands come through TMA
descriptors when 16-byte aligned, else masked pointer loads; nothing syncs.

On sm_90, BLOCK with TMA-ready operands runs the warp-specialized Gluon kernel of
hopper/blockwise.py instead (1.6-1.7x this one at E=8 T=16384 4096x14336, H100).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels._triton import cdiv, next_power_of_2
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.gemm.dense import tma_ok
from fuseops.kernels.gemm.dense_scaled import (
    Operand,
    accumulate,
    dequantize_tile,
    load_raw,
    pick_config,
    reference_operand,
)
from fuseops.kernels.gemm.grouped import GemmConfig, _group_tiles, group_tile, persistent_programs
from fuseops.kernels.hopper.pipeline import dummy_or
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling


@triton.jit
def walk(offsets, G, N, KB, SCALING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr):
    """The persistent walk over [BLOCK_M, BLOCK_N] tiles of all groups (gemm/grouped.py): tiles
    per group and each group's first tile, tiles along N, and K steps over KB bytes a row."""
    BKB: tl.constexpr = BLOCK_K // 2 if SCALING == 3 else BLOCK_K
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles, first = _group_tiles(offsets, G, tiles_n, BLOCK_M, BLOCK_G)
    return tiles, first, tiles_n, tl.cdiv(KB, BKB)


@triton.jit
def load_a_tile(a, a_scale, row0, off_m, rows, mask_m, stride_am, stride_asm, ki, KB, KS_A,
                SCALING: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """K step ``ki`` of the group's rows ``rows`` (group-local ``off_m`` on) as ``tl.dot`` takes
    it. With TMA ``a`` is a descriptor over [M, KB]: rows past the group read the next group's
    (their results are never stored); else masked pointers give zeros."""
    BKB: tl.constexpr = BLOCK_K // 2 if SCALING == 3 else BLOCK_K
    if TMA:
        raw = a.load([(row0 + off_m).to(tl.int32), ki * BKB])
    else:
        raw = load_raw(a, rows, mask_m, stride_am, ki, KB, SCALING, BLOCK_K)
    return dequantize_tile(raw, a_scale, rows, mask_m, stride_asm, ki, KS_A, SCALING, BLOCK_M, BLOCK_K)


@triton.jit
def accumulate_rows(acc, a_tile, a_scale, rows, mask_m, stride_asm, b, g, stride_bg, stride_bn,
                    b_scale_g, stride_bsn, rows_b, mask_b, box_row, ki, KB, KS_B,
                    SCALING: tl.constexpr, B_ROWS_PER_SCALE: tl.constexpr, TMA: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """``acc + a_tile @ dequant(b[g][rows_b])^T`` for K step ``ki``. ``rows_b`` [BLOCK_R] index
    ``b[g]``'s rows and block scales (``b_scale_g``: group g's); with TMA ``b`` is a descriptor
    over [G, rows, KB] read from row ``box_row`` of it (it may be a view of some of b's rows)."""
    BKB: tl.constexpr = BLOCK_K // 2 if SCALING == 3 else BLOCK_K
    if TMA:
        raw = tl.reshape(b.load([g, box_row, ki * BKB]), [BLOCK_R, BKB])
    else:
        raw = load_raw(b + g.to(tl.int64) * stride_bg, rows_b, mask_b, stride_bn, ki, KB, SCALING, BLOCK_K)
    b_tile = dequantize_tile(raw, b_scale_g, rows_b, mask_b, stride_bsn, ki, KS_B, SCALING, BLOCK_R, BLOCK_K)
    return accumulate(acc, a_tile, b_tile, a_scale, b_scale_g, rows, rows_b, mask_m, mask_b,
                      stride_asm, stride_bsn, ki, SCALING, 1, B_ROWS_PER_SCALE)


@triton.jit
def outer_and_bias(acc, g, rows, mask_m, cols, mask_n, a_outer, stride_aog, stride_aom, b_outer,
                   stride_bog, stride_bon, bias, stride_biasg, HAS_OUTER_A: tl.constexpr,
                   HAS_OUTER_B: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The product's columns ``cols`` (rows of ``b``) times a's and b's outer factors, plus bias."""
    if HAS_OUTER_A:
        acc *= tl.load(a_outer + g * stride_aog + rows * stride_aom, mask=mask_m, other=0.0)[:, None]
    if HAS_OUTER_B:
        acc *= tl.load(b_outer + g * stride_bog + cols * stride_bon, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias + g * stride_biasg + cols, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def grouped_gemm_scaled_kernel(
    a, a_scale, a_outer, b, b_scale, b_outer, y, bias, offsets,
    G, N, KB, KS_A, KS_B,
    stride_am, stride_bg, stride_bn, stride_asm, stride_bsg, stride_bsn,
    stride_aog, stride_aom, stride_bog, stride_bon, stride_ym, stride_biasg,
    SCALING: tl.constexpr, B_ROWS_PER_SCALE: tl.constexpr, HAS_OUTER_A: tl.constexpr,
    HAS_OUTER_B: tl.constexpr, HAS_BIAS: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK_G: tl.constexpr, NUM_PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    # With TMA, ``a`` is a descriptor over [M, KB] (a tile may overhang into the next group:
    # those rows are dropped on store) and ``b`` one over [G, N, KB].
    tiles, first, tiles_n, k_tiles = walk(offsets, G, N, KB, SCALING, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_G)
    for tile in tl.range(tl.program_id(0), tl.sum(tiles), NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        g, row0, size, pid_m, pid_n = group_tile(tile, tiles, first, offsets, tiles_n, BLOCK_M, BLOCK_G,
                                                 GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = row0 + offs_m
        mask_m = offs_m < size
        mask_n = offs_n < N
        b_scale_g = b_scale + g * stride_bsg
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a_tile = load_a_tile(a, a_scale, row0, pid_m * BLOCK_M, rows, mask_m, stride_am, stride_asm,
                                 ki, KB, KS_A, SCALING, TMA, BLOCK_M, BLOCK_K)
            acc = accumulate_rows(acc, a_tile, a_scale, rows, mask_m, stride_asm, b, g, stride_bg,
                                  stride_bn, b_scale_g, stride_bsn, offs_n, mask_n, pid_n * BLOCK_N, ki,
                                  KB, KS_B, SCALING, B_ROWS_PER_SCALE, TMA, BLOCK_N, BLOCK_K)
        acc = outer_and_bias(acc, g, rows, mask_m, offs_n, mask_n, a_outer, stride_aog, stride_aom,
                             b_outer, stride_bog, stride_bon, bias, stride_biasg,
                             HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS)
        mask = mask_m[:, None] & mask_n[None, :]
        tl.store(y + rows[:, None] * stride_ym + offs_n[None, :], acc.to(y.dtype.element_ty), mask=mask)


def bytes_per_step(block: int, scaling: Scaling) -> int:
    """Bytes of ``block`` elements along the quantized dim (NVFP4 packs pairs)."""
    return block // 2 if scaling == Scaling.NVFP4 else block


def grouped_gemm_scaled(
    a: Operand,
    b: Operand,
    offsets: torch.Tensor,
    *,
    scaling: Scaling,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rows of group g of ``a`` times ``b[g]^T`` (module docstring).

    Args:
        a: [M, K] operand, rows grouped contiguously by ``offsets``; ``outer`` [G] per group
            (or [M] per row).
        b: [G, N, K] operand; ``outer`` [G] (or [G, N] per row); 128x128 block scales
            [G, N / 128, K / 128] with ``rows_per_scale`` 128.
        offsets: int64 [G + 1] device tensor; M == offsets[G] (never checked: no sync).
        out_dtype: dtype of y. bias: [G, N] or None. out: [M, N] to write into, or None.
    Returns:
        y [M, N].
    """
    b_mem = b.data if b.data.stride(2) == 1 else b.data.contiguous()
    cfg = pick_config(scaling, tma_ok(a.data, b_mem), out_dtype == torch.float32)
    return launch_grouped_gemm_scaled(a, b, offsets, scaling, out_dtype, bias, out, cfg)


def launch_grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, scaling: Scaling,
                               out_dtype: torch.dtype, bias: torch.Tensor | None,
                               out: torch.Tensor | None, cfg: GemmConfig) -> torch.Tensor:
    """``grouped_gemm_scaled`` with an explicit tile config (what the benchmark's sweep calls)."""
    M, G, N = a.data.shape[0], b.data.shape[0], b.data.shape[1]
    y = out if out is not None else torch.empty(M, N, dtype=out_dtype, device=a.data.device)
    if M == 0 or N == 0:
        return y
    a_data = a.data if a.data.stride(1) == 1 else a.data.contiguous()
    b_data = b.data if b.data.stride(2) == 1 else b.data.contiguous()
    bkb = bytes_per_step(cfg.block_k, scaling)
    tma = tma_ok(a_data, b_data)
    a_arg = TensorDescriptor.from_tensor(a_data, [cfg.block_m, bkb]) if tma else a_data
    b_arg = TensorDescriptor.from_tensor(b_data, [1, cfg.block_n, bkb]) if tma else b_data
    a_scale, b_scale = a.kernel_scale(), b.kernel_scale()
    (aog, aom), (bog, bon) = a.outer_strides(), b.outer_strides()
    programs = persistent_programs(a_data, (cdiv(M, cfg.block_m) + G) * cdiv(N, cfg.block_n),
                                   cfg.programs_per_sm)
    launch(grouped_gemm_scaled_kernel, (programs,),
        a_arg, dummy_or(a_scale, y), dummy_or(a.outer, y), b_arg, dummy_or(b_scale, y),
        dummy_or(b.outer, y), y, dummy_or(bias, y), offsets,
        G, N, a_data.shape[1],
        a_scale.shape[-1] if a_scale is not None else 0, b_scale.shape[-1] if b_scale is not None else 0,
        a_data.stride(0), b_data.stride(0), b_data.stride(1),
        a_scale.stride(0) if a_scale is not None else 0,
        b_scale.stride(0) if b_scale is not None else 0, b_scale.stride(1) if b_scale is not None else 0,
        aog, aom, bog, bon, y.stride(0), bias.stride(0) if bias is not None else 0,
        SCALING=int(scaling), B_ROWS_PER_SCALE=b.rows_per_scale, HAS_OUTER_A=a.outer is not None,
        HAS_OUTER_B=b.outer is not None, HAS_BIAS=bias is not None, TMA=tma,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        BLOCK_G=max(16, next_power_of_2(G)), NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
        WARP_SPECIALIZE=cfg.warp_specialize,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y


def reference_grouped_gemm_scaled(
    a: Operand,
    b: Operand,
    offsets: torch.Tensor,
    *,
    scaling: Scaling,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """For each group g and its rows r = offsets[g]:offsets[g+1], in float32:
    ``y[r] = A[r] @ B[g]^T (+ bias[g])``, A and B the operands' values (elements x block
    scales x ``outer``: a's per group g, or per row), cast to ``out_dtype``."""
    A = reference_operand(Operand(a.data, a.scale, None, a.rows_per_scale), scaling)
    B = reference_operand(b, scaling)
    y = torch.zeros(A.shape[0], B.shape[1], dtype=torch.float32, device=A.device)
    bounds = offsets.tolist()
    for g in range(B.shape[0]):
        r = slice(bounds[g], bounds[g + 1])
        y[r] = A[r] @ B[g].T
        if a.outer is not None:
            y[r] *= (a.outer[r] if a.outer_per_row else a.outer[g]).float().reshape(-1, 1)
        if bias is not None:
            y[r] += bias[g].float()
    return out.copy_(y) if out is not None else as_dtype(y, out_dtype)
