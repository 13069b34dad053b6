"""FC2's dgrad in a gated MoE expert MLP under a recipe: the quantized grouped GEMM whose
epilogue applies the gate's derivative and writes FC1's output gradient already quantized.

``dh = dequant(dy[rows of g]) @ dequant(b[g])^T`` with gemm/grouped_scaled.py's dgrad operands
(``a`` [M, H] dy row-wise in the gradient format, ``b`` [G, F, H] FC2's weight column-wise),
rounded to ``out_dtype`` as that kernel stores it (so everything after is exactly what the
unfused gated backward computes from the ``dh`` it reads); then, from the saved ``z`` [M, 2F]:
``dz`` = the gradient of ``gated(z_a, z_b)`` for the upstream ``dh * probs[:, None]``, in z's
column layout, and ``dprobs[r] = sum_j dh[r, j] * gated(z_a, z_b)[r, j]`` (float32 partials per
column tile, summed by bias_grad's second stage: deterministic). ``dz`` leaves through
quantization/epilogue.py's ``store_quantized`` in FC1's gradient format: the row-wise copy for
the block formats, ``dz`` itself and per-row amaxes for the per-tensor ones (the amax pass over
``dz`` is saved; ``fuseops.quant.emit`` then casts). No ``dh`` and no high-precision ``dz`` pass
through memory unless the column-wise copy or a per-tensor scale needs ``dz``.

The non-interleaved layout stores z's halves as two column ranges, so a quantization block
must not straddle column F: F a multiple of the block (the fusion's guard). Tiling: the
persistent group-tile walk of gemm/grouped.py over [BLOCK_M, BLOCK_N] tiles of ``dh``; the
operands by TMA descriptors when aligned, else masked pointers; ``z`` and ``probs`` by pointers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels._triton import INTERPRET, cdiv, next_power_of_2
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.elementwise.activation_math import AnyActivation, gated_and_grad, kernel_act
from fuseops.kernels.elementwise.bias_grad import sum_partials
from fuseops.kernels.elementwise.gated_activation import reference_gated_bwd
from fuseops.kernels.gemm.dense import tma_ok
from fuseops.kernels.gemm.grouped import GemmConfig, group_tile, persistent_programs
from fuseops.kernels.gemm.grouped_gated import _pair_cols
from fuseops.kernels.gemm.grouped_scaled import (
    accumulate_rows,
    bytes_per_step,
    load_a_tile,
    outer_and_bias,
    reference_grouped_gemm_scaled,
    walk,
)
from fuseops.kernels.hopper.pipeline import dummy_or
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization import epilogue as qe
from fuseops.kernels.quantization.formats import BLOCK_SIZE, Element, Scaling
from fuseops.kernels.quantization.operand import Operand


def _config(scaling: Scaling) -> GemmConfig:
    """One tile per format, not timed: 64 rows as the blockwise gated forward, whose 128-row
    tile spills; the epilogue holds the dh tile, both z tiles and both gradients at once."""
    if INTERPRET:
        return GemmConfig(32, 32, 128 if scaling == Scaling.BLOCK else 64, 2, 4, 1)
    block_k = 64 if scaling in (Scaling.MX, Scaling.NVFP4) else 128
    return GemmConfig(64, 128, block_k, 8, 8, 3, flatten=False)


def half_width(grad_scaling: Scaling, interleaved: bool, block_n: int) -> int:
    """BLOCK_N (columns of dh) such that each half's (or, interleaved, the pair tile's) columns
    of dz hold whole quantization blocks."""
    if interleaved:
        return qe.tile_columns(grad_scaling, 2 * block_n) // 2
    return qe.tile_columns(grad_scaling, block_n)


@triton.jit
def _store_dz(da, db, rows, mask_m, off_n, F, y, stride_y, data, stride_d, scale, stride_s, row_amax,
              SCALING: tl.constexpr, ELEM: tl.constexpr, QBLOCK: tl.constexpr, STORE_Y: tl.constexpr,
              INTERLEAVED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dz's tile in z's layout through ``store_quantized``: interleaved pairs as one tile of
    2 * BLOCK_N columns, else the gate half at columns off_n.. and the up half at F + off_n..
    (F a multiple of QBLOCK, so the up half's blocks start at scale column F / QBLOCK)."""
    if INTERLEAVED:
        pair = tl.reshape(tl.join(da, db), [BLOCK_M, 2 * BLOCK_N])
        qe.store_quantized(pair, rows, mask_m, 2 * off_n, 2 * F, y, stride_y, data, stride_d, scale,
                           stride_s, row_amax, SCALING, ELEM, QBLOCK, STORE_Y, BLOCK_M, 2 * BLOCK_N)
    else:
        qe.store_quantized(da, rows, mask_m, off_n, F, y, stride_y, data, stride_d, scale, stride_s,
                           row_amax, SCALING, ELEM, QBLOCK, STORE_Y, BLOCK_M, BLOCK_N)
        qe.store_quantized(db, rows, mask_m, off_n, F, y + F, stride_y, data + F, stride_d,
                           scale + F // QBLOCK, stride_s, row_amax, SCALING, ELEM, QBLOCK, STORE_Y,
                           BLOCK_M, BLOCK_N)


@triton.jit(do_not_specialize=["F"])
def grouped_gemm_scaled_dgrad_gated_kernel(
    a, a_scale, a_outer, b, b_scale, b_outer, offsets, z, probs, partials, dh_like,
    y, data, scale, row_amax,
    G, F, KB, KS_A, KS_B, M,
    stride_am, stride_bg, stride_bn, stride_asm, stride_bsg, stride_bsn,
    stride_aog, stride_aom, stride_bog, stride_bon, stride_zm,
    stride_y, stride_d, stride_s, limit, alpha,
    SCALING: tl.constexpr, GRAD_SCALING: tl.constexpr, ELEM: tl.constexpr, QBLOCK: tl.constexpr,
    STORE_Y: tl.constexpr, B_ROWS_PER_SCALE: tl.constexpr, HAS_OUTER_A: tl.constexpr,
    HAS_OUTER_B: tl.constexpr, ACT: tl.constexpr, CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_PROBS: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK_G: tl.constexpr, NUM_PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr,
):
    # partials: [tiles_n, M] float32; the tile (g, pid_m, pid_n) owns its rows of row pid_n.
    # dh_like: a 0-element tensor of dh's dtype.
    tiles, first, tiles_n, k_tiles = walk(offsets, G, F, KB, SCALING, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_G)
    for tile in tl.range(tl.program_id(0), tl.sum(tiles), NUM_PROGRAMS, flatten=FLATTEN):
        g, row0, size, pid_m, pid_n = group_tile(tile, tiles, first, offsets, tiles_n, BLOCK_M, BLOCK_G,
                                                 GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        rows = row0 + offs_m
        mask_m = offs_m < size
        mask_n = offs_n < F
        b_scale_g = b_scale + g * stride_bsg
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a_tile = load_a_tile(a, a_scale, row0, off_m, rows, mask_m, stride_am, stride_asm,
                                 ki, KB, KS_A, SCALING, TMA, BLOCK_M, BLOCK_K)
            acc = accumulate_rows(acc, a_tile, a_scale, rows, mask_m, stride_asm, b, g, stride_bg,
                                  stride_bn, b_scale_g, stride_bsn, offs_n, mask_n, off_n, ki,
                                  KB, KS_B, SCALING, B_ROWS_PER_SCALE, TMA, BLOCK_N, BLOCK_K)
        acc = outer_and_bias(acc, g, rows, mask_m, offs_n, mask_n, a_outer, stride_aog, stride_aom,
                             b_outer, stride_bog, stride_bon, b_outer, 0, HAS_OUTER_A, HAS_OUTER_B, False)
        mask = mask_m[:, None] & mask_n[None, :]
        # dh as the unfused dgrad stores it; zero outside the tile's rows and columns.
        dh = tl.where(mask, acc.to(dh_like.dtype.element_ty).to(tl.float32), 0.0)
        cols_a, cols_b = _pair_cols(offs_n, F, INTERLEAVED)
        z_rows = z + rows[:, None].to(tl.int64) * stride_zm
        za = tl.load(z_rows + cols_a[None, :], mask=mask, other=0.0).to(tl.float32)
        zb = tl.load(z_rows + cols_b[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_PROBS:
            p = tl.load(probs + rows, mask=mask_m, other=0.0).to(tl.float32)[:, None]
            out, da, db = gated_and_grad(za, zb, dh * p, ACT, CLAMPED, limit, alpha)
            tl.store(partials + pid_n * M + rows, tl.sum(dh * out, 1), mask=mask_m)
        else:
            out, da, db = gated_and_grad(za, zb, dh, ACT, CLAMPED, limit, alpha)
        _store_dz(da, db, rows, mask_m, off_n, F, y, stride_y, data, stride_d, scale, stride_s, row_amax,
                  GRAD_SCALING, ELEM, QBLOCK, STORE_Y, INTERLEAVED, BLOCK_M, BLOCK_N)


def check_split(F: int, grad_scaling: Scaling, interleaved: bool) -> None:
    block = BLOCK_SIZE[grad_scaling] or 1
    if not interleaved and F % block:
        raise ValueError(f"F: expected a multiple of the gradient format's block {block} when z's halves are "
                         f"separate column ranges (not interleaved), got {F}")


def grouped_gemm_scaled_dgrad_gated(
    a: Operand,
    b: Operand,
    offsets: torch.Tensor,
    z: torch.Tensor,
    *,
    scaling: Scaling,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    grad_scaling: Scaling,
    element: Element,
    store_y: bool,
    out_dtype: torch.dtype,
) -> tuple[qe.Emitted, torch.Tensor | None]:
    """FC2's dgrad through the gate, ``dz`` emitted quantized (module docstring).

    Args:
        a: [M, H] operand (FC2's output gradient row-wise), rows grouped by ``offsets``.
        b: [G, F, H] operand (FC2's weight's column-wise copy).
        offsets: int64 [G + 1] device tensor; M == offsets[G] (never checked: no sync).
        z: [M, 2F] the saved pre-activation (its dtype is dz's).
        scaling: the operands' format. act, interleaved, clamped, limit, alpha: the gate.
        probs: [M] router probabilities (the forward's row scale) or None.
        grad_scaling, element, store_y: dz's format (FC1's gradient format) and whether dz
            itself is written (``quantization/epilogue.py``).
        out_dtype: dh's rounding (the unfused dgrad's output dtype).
    Returns:
        ``(emitted, dprobs)``: dz's ``Emitted`` [M, 2F]; ``dprobs`` [M] in ``probs``' dtype or None.
    """
    M, G, F = a.data.shape[0], b.data.shape[0], b.data.shape[1]
    check_split(F, grad_scaling, interleaved)
    device = a.data.device
    out = qe.allocate(M, 2 * F, z.dtype, device, scaling=grad_scaling, element=element, store_y=store_y)
    cfg = _config(scaling)
    bm, bk = cfg.block_m, cfg.block_k
    bn = half_width(grad_scaling, interleaved, cfg.block_n)
    tiles_n = cdiv(F, bn)
    partials = torch.zeros(tiles_n, M, dtype=torch.float32, device=device) if probs is not None else None
    if M and F:
        a_data = a.data if a.data.stride(1) == 1 else a.data.contiguous()
        b_data = b.data if b.data.stride(2) == 1 else b.data.contiguous()
        zc = z if z.stride(1) == 1 else z.contiguous()
        bkb = bytes_per_step(bk, scaling)
        tma = tma_ok(a_data, b_data)
        a_arg = TensorDescriptor.from_tensor(a_data, [bm, bkb]) if tma else a_data
        b_arg = TensorDescriptor.from_tensor(b_data, [1, bn, bkb]) if tma else b_data
        a_scale, b_scale = a.kernel_scale(), b.kernel_scale()
        (aog, aom), (bog, bon) = a.outer_strides(), b.outer_strides()
        y, data, scale, row_amax = qe.kernel_args(out, z.dtype, device)
        programs = persistent_programs(a_data, (cdiv(M, bm) + G) * tiles_n, cfg.programs_per_sm)
        launch(grouped_gemm_scaled_dgrad_gated_kernel, (programs,),
            a_arg, dummy_or(a_scale, zc), dummy_or(a.outer, zc), b_arg, dummy_or(b_scale, zc),
            dummy_or(b.outer, zc), offsets, zc, dummy_or(probs, zc), dummy_or(partials, zc),
            torch.empty(0, dtype=out_dtype, device=device), y, data, scale, row_amax,
            G, F, a_data.shape[1],
            a_scale.shape[-1] if a_scale is not None else 0, b_scale.shape[-1] if b_scale is not None else 0, M,
            a_data.stride(0), b_data.stride(0), b_data.stride(1),
            a_scale.stride(0) if a_scale is not None else 0,
            b_scale.stride(0) if b_scale is not None else 0, b_scale.stride(1) if b_scale is not None else 0,
            aog, aom, bog, bon, zc.stride(0), *qe.strides(out), float(limit), float(alpha),
            SCALING=int(scaling), GRAD_SCALING=int(grad_scaling), ELEM=int(element),
            QBLOCK=BLOCK_SIZE[grad_scaling] or 1, STORE_Y=out.y is not None, B_ROWS_PER_SCALE=b.rows_per_scale,
            HAS_OUTER_A=a.outer is not None, HAS_OUTER_B=b.outer is not None, ACT=kernel_act(act), CLAMPED=clamped,
            INTERLEAVED=interleaved, HAS_PROBS=probs is not None, TMA=tma,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
            BLOCK_G=max(16, next_power_of_2(G)), NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    dprobs = None
    if partials is not None:
        dprobs = as_dtype(partials.sum(0), probs.dtype) if M == 0 or F == 0 else sum_partials(partials, probs.dtype)
    return out, dprobs


def reference_grouped_gemm_scaled_dgrad_gated(
    a: Operand,
    b: Operand,
    offsets: torch.Tensor,
    z: torch.Tensor,
    *,
    scaling: Scaling,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    grad_scaling: Scaling,
    element: Element,
    store_y: bool,
    out_dtype: torch.dtype,
) -> tuple[qe.Emitted, torch.Tensor | None]:
    """The unfused ops' maths: ``dh = reference_grouped_gemm_scaled(a, b, offsets)`` in
    ``out_dtype``; ``dz, dprobs = reference_gated_bwd(z, dh, ..., probs=probs)``; then
    ``quant_epilogue.reference_emit(dz)`` in the gradient format."""
    F = b.data.shape[1]
    check_split(F, grad_scaling, interleaved)
    dh = reference_grouped_gemm_scaled(a, b, offsets, scaling=scaling, out_dtype=out_dtype)
    dz, dprobs = reference_gated_bwd(z.reshape(-1, 2 * F), dh, act, interleaved=interleaved, clamped=clamped,
                                     limit=limit, alpha=alpha, probs=probs)
    return qe.reference_emit(dz, scaling=grad_scaling, element=element, store_y=store_y), dprobs
