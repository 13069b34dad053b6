"""FC1 of an MoE expert MLP under a recipe: the quantized grouped GEMM with the activation
and the quantization of FC2's input in its epilogue.

``z = dequant(a[rows of g]) @ dequant(b[g])^T (+ bias[g])`` with gemm/grouped_scaled.py's
forward operands (``a`` [M, K] x row-wise, ``b`` [G, N, K] FC1's weight row-wise), rounded to
``out_dtype`` as that kernel stores it; then ``h = act(z)`` [M, N], or gated ``h = gated(z_a,
z_b) * probs[:, None]`` [M, N / 2] (``z_a, z_b`` the halves or interleaved pairs of z's columns,
as gemm/grouped_gated.py). ``h`` leaves through quantization/epilogue.py's ``store_quantized`` in the
same scaling (FC2's input format), and ``z`` is stored when backward needs it. Rounding ``z``
before the activation makes ``h`` exactly what the activation op computes from the ``z`` it
saved.

Tiling: gemm/grouped.py's persistent walk over group tiles. A program owns BLOCK_N columns of
``h``, whole quantization blocks (``quant_epilogue.tile_columns``); gated, the gate and up rows
of ``b`` go into two [BLOCK_M, BLOCK_N] accumulators that share the A tile, or (interleaved)
one [BLOCK_M, 2 * BLOCK_N] accumulator split in the epilogue. Operands come through TMA
descriptors when aligned (gated: one over each half of ``b``), else masked pointers; ``z``
leaves through ragged descriptors (grouped_gemm_gated's ``store_pair``) when aligned. The
epilogue runs on two column halves where each holds whole quantization blocks.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels._triton import INTERPRET, cdiv, next_power_of_2
from fuseops.kernels.elementwise.activation import reference_activation_fwd
from fuseops.kernels.elementwise.activation_math import AnyActivation, activation, gated, kernel_act
from fuseops.kernels.elementwise.gated_activation import reference_gated_fwd
from fuseops.kernels.gemm.dense import tma_ok
from fuseops.kernels.gemm.grouped import (
    GemmConfig,
    group_tile,
    halves,
    persistent_programs,
    ragged_descriptor,
    ragged_store,
)
from fuseops.kernels.gemm.grouped import tma_ok as grouped_tma_ok
from fuseops.kernels.gemm.grouped_gated import _pair_cols, pair_args, pair_views, store_pair
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

# FC1's input formats where this kernel measured slower than FC1's plain quantized GEMM followed by
# the separate activation-quantize kernel (H100, Qwen3-30B-A3B and Mixtral expert shapes,
# ``python -m benchmarks.fp8_moe --ab-fusions``): FP8 current scaling and blockwise, whose main
# loop runs on float8 tensor cores at 1.1-1.4 PFLOP/s, 3-6 % slower forward (the epilogue, writing
# z and h, does not overlap it); MXFP8 and NVFP4, which dequantize tiles in the main loop, 6-13 %
# faster. The one place the choice is made: the fused MLP forward
# (fusions/forward_quantized_grouped_mlp.py) and the quantized expert layer
# (moe/expert_layer_quantized.py) read it at each use, so an A/B sets it here (benchmarks.fp8_moe).
UNFUSED_FASTER = (Scaling.TENSOR, Scaling.BLOCK)


@functools.cache
def _configs() -> dict[tuple[Scaling, bool], GemmConfig]:
    """Tiles by (format, gated); ``block_n`` counts columns of ``h`` before widening to a whole
    block. BLOCK_K is the 128-long block for BLOCK, 64 elements otherwise (as gemm/dense_scaled.py).

    Timed on an H100 (gated SwiGLU with probs, saving z): FP8 current scaling 128x128 without
    loop flattening ran 1097 / 855 TFLOP/s at the Mixtral / Qwen3 expert shapes, against
    412-601 / 316-487 for 64x128 and 871 / 766 flattened; FP8 blockwise keeps 64 rows (128x128
    holds four float32 tiles: 194-200 TFLOP/s, spilling).
    MX and NVFP4 (emulated) take current scaling's tile, untimed."""
    if INTERPRET:
        return {(s, g): GemmConfig(32, 32, 128 if s == Scaling.BLOCK else 64, 2, 4, 1)
                for s in Scaling for g in (False, True)}
    table = {}
    for s in Scaling:
        block_k = 64 if s in (Scaling.MX, Scaling.NVFP4) else 128
        table[s, False] = GemmConfig(128, 128, block_k, 8, 8, 3, flatten=False)
        table[s, True] = GemmConfig(64 if s == Scaling.BLOCK else 128, 128, block_k, 8, 8, 3, flatten=False)
    return table


@triton.jit
def _preact(acc, g, rows, mask_m, cols, mask_n, a_outer, stride_aog, stride_aom, b_outer, stride_bog,
            stride_bon, bias, stride_biasg, y, HAS_OUTER_A: tl.constexpr, HAS_OUTER_B: tl.constexpr,
            HAS_BIAS: tl.constexpr):
    """z's columns ``cols`` as grouped_gemm_scaled stores them (in ``y``'s dtype), as float32."""
    acc = outer_and_bias(acc, g, rows, mask_m, cols, mask_n, a_outer, stride_aog, stride_aom, b_outer,
                         stride_bog, stride_bon, bias, stride_biasg, HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS)
    return acc.to(y.dtype.element_ty).to(tl.float32)


# F is never specialized: Triton 3.6's sm_90 build for F == 1 (a one-column h) stores MXFP8
# scales 2**8 too large while the data beside them is right (H100; exact in the interpreter,
# and with F unspecialized). It only bounds masks, so nothing is lost.
@triton.jit(do_not_specialize=["F"])
def grouped_gemm_scaled_act_kernel(
    a, a_scale, a_outer, b_gate, b_up, b_scale, b_outer, offsets, bias, probs,
    z_a, z_b, y, data, scale, row_amax,
    G, F, KB, KS_A, KS_B,
    stride_am, stride_bg, stride_bn, stride_asm, stride_bsg, stride_bsn,
    stride_aog, stride_aom, stride_bog, stride_bon, stride_biasg, stride_zm,
    stride_y, stride_d, stride_s, limit, alpha,
    SCALING: tl.constexpr, ELEM: tl.constexpr, QBLOCK: tl.constexpr, STORE_Y: tl.constexpr,
    B_ROWS_PER_SCALE: tl.constexpr, HAS_OUTER_A: tl.constexpr, HAS_OUTER_B: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT: tl.constexpr, GATED: tl.constexpr, CLAMPED: tl.constexpr,
    INTERLEAVED: tl.constexpr, HAS_PROBS: tl.constexpr, SAVE_PREACT: tl.constexpr, TMA: tl.constexpr, TMA_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK_G: tl.constexpr, NUM_PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, EPILOGUE_PARTS: tl.constexpr,
):
    # F: columns of h. b_gate / b_up: b itself (pointers), or descriptors over b's gate and up
    # halves; over all of b when plain or interleaved (b_up unused then). z_a / z_b: z itself,
    # or (TMA_Z) ragged descriptors as grouped_gemm_gated's store_pair takes them.
    tiles, first, tiles_n, k_tiles = walk(offsets, G, F, KB, SCALING, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_G)
    for tile in tl.range(tl.program_id(0), tl.sum(tiles), NUM_PROGRAMS, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
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
        if INTERLEAVED:
            # Rows 2n (gate) and 2n + 1 (up) of b: one tile of 2 * BLOCK_N rows.
            rows_b = 2 * off_n + tl.arange(0, 2 * BLOCK_N)
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a_tile = load_a_tile(a, a_scale, row0, off_m, rows, mask_m, stride_am, stride_asm,
                                     ki, KB, KS_A, SCALING, TMA, BLOCK_M, BLOCK_K)
                acc = accumulate_rows(acc, a_tile, a_scale, rows, mask_m, stride_asm, b_gate, g,
                                      stride_bg, stride_bn, b_scale_g, stride_bsn, rows_b, rows_b < 2 * F,
                                      2 * off_n, ki, KB, KS_B, SCALING, B_ROWS_PER_SCALE, TMA,
                                      2 * BLOCK_N, BLOCK_K)
            acc_a, acc_b = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_N, 2]))
        else:
            acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_tiles):
                a_tile = load_a_tile(a, a_scale, row0, off_m, rows, mask_m, stride_am, stride_asm,
                                     ki, KB, KS_A, SCALING, TMA, BLOCK_M, BLOCK_K)
                acc_a = accumulate_rows(acc_a, a_tile, a_scale, rows, mask_m, stride_asm, b_gate, g,
                                        stride_bg, stride_bn, b_scale_g, stride_bsn, offs_n, mask_n,
                                        off_n, ki, KB, KS_B, SCALING, B_ROWS_PER_SCALE, TMA,
                                        BLOCK_N, BLOCK_K)
                if GATED:
                    # The up half: rows F.. of b (scales by those rows), row off_n of its descriptor.
                    acc_b = accumulate_rows(acc_b, a_tile, a_scale, rows, mask_m, stride_asm, b_up, g,
                                            stride_bg, stride_bn, b_scale_g, stride_bsn, F + offs_n,
                                            mask_n, off_n, ki, KB, KS_B, SCALING, B_ROWS_PER_SCALE,
                                            TMA, BLOCK_N, BLOCK_K)
        _act_epilogue(acc_a, acc_b, g, row0, size, off_m, off_n, rows, mask_m, F, a_outer, stride_aog,
                      stride_aom, b_outer, stride_bog, stride_bon, bias, stride_biasg, probs, z_a, z_b,
                      stride_zm, y, stride_y, data, stride_d, scale, stride_s, row_amax, limit, alpha,
                      SCALING, ELEM, QBLOCK, STORE_Y, HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS, ACT, GATED,
                      CLAMPED, INTERLEAVED, HAS_PROBS, SAVE_PREACT, TMA_Z, EPILOGUE_PARTS, BLOCK_M,
                      BLOCK_N)


@triton.jit
def _act_epilogue(acc_a, acc_b, g, row0, size, off_m, off_n, rows, mask_m, F, a_outer, stride_aog,
                  stride_aom, b_outer, stride_bog, stride_bon, bias, stride_biasg, probs, z_a, z_b,
                  stride_zm, y, stride_y, data, stride_d, scale, stride_s, row_amax, limit, alpha,
                  SCALING: tl.constexpr, ELEM: tl.constexpr, QBLOCK: tl.constexpr,
                  STORE_Y: tl.constexpr, HAS_OUTER_A: tl.constexpr, HAS_OUTER_B: tl.constexpr,
                  HAS_BIAS: tl.constexpr, ACT: tl.constexpr, GATED: tl.constexpr,
                  CLAMPED: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_PROBS: tl.constexpr,
                  SAVE_PREACT: tl.constexpr, TMA_Z: tl.constexpr, PARTS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """z, the activation, the probabilities and h's quantized store of columns off_n.., on
    PARTS column slices (each whole quantization blocks): fewer live registers at once."""
    if PARTS > 1:
        a_l, a_r = halves(acc_a, BLOCK_M, BLOCK_N)
        b_l, b_r = halves(acc_b, BLOCK_M, BLOCK_N)
        _act_epilogue(a_l, b_l, g, row0, size, off_m, off_n, rows, mask_m, F, a_outer, stride_aog,
                      stride_aom, b_outer, stride_bog, stride_bon, bias, stride_biasg, probs, z_a, z_b,
                      stride_zm, y, stride_y, data, stride_d, scale, stride_s, row_amax, limit, alpha,
                      SCALING, ELEM, QBLOCK, STORE_Y, HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS, ACT, GATED,
                      CLAMPED, INTERLEAVED, HAS_PROBS, SAVE_PREACT, TMA_Z, PARTS // 2, BLOCK_M,
                      BLOCK_N // 2)
        _act_epilogue(a_r, b_r, g, row0, size, off_m, off_n + BLOCK_N // 2, rows, mask_m, F, a_outer,
                      stride_aog, stride_aom, b_outer, stride_bog, stride_bon, bias, stride_biasg,
                      probs, z_a, z_b, stride_zm, y, stride_y, data, stride_d, scale, stride_s,
                      row_amax, limit, alpha, SCALING, ELEM, QBLOCK, STORE_Y, HAS_OUTER_A,
                      HAS_OUTER_B, HAS_BIAS, ACT, GATED, CLAMPED, INTERLEAVED, HAS_PROBS, SAVE_PREACT,
                      TMA_Z, PARTS // 2, BLOCK_M, BLOCK_N // 2)
    else:
        offs_n = off_n + tl.arange(0, BLOCK_N)
        mask_n = offs_n < F
        cols_a, cols_b = _pair_cols(offs_n, F, INTERLEAVED)
        za = _preact(acc_a, g, rows, mask_m, cols_a, mask_n, a_outer, stride_aog, stride_aom, b_outer,
                     stride_bog, stride_bon, bias, stride_biasg, y, HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS)
        if GATED:
            zb = _preact(acc_b, g, rows, mask_m, cols_b, mask_n, a_outer, stride_aog, stride_aom,
                         b_outer, stride_bog, stride_bon, bias, stride_biasg, y,
                         HAS_OUTER_A, HAS_OUTER_B, HAS_BIAS)
            if SAVE_PREACT:
                store_pair(z_a, z_b, za, zb, row0, size, off_m, off_n, F, stride_zm, INTERLEAVED,
                           TMA_Z, BLOCK_M, BLOCK_N)
            out = gated(za, zb, ACT, CLAMPED, limit, alpha)
        else:
            if SAVE_PREACT and TMA_Z:
                ragged_store(z_a, row0, size, off_m, off_n, za.to(z_a.dtype), BLOCK_M, BLOCK_N)
            elif SAVE_PREACT:
                mask = mask_m[:, None] & mask_n[None, :]
                z_ptrs = z_a + rows[:, None] * stride_zm + offs_n[None, :]
                tl.store(z_ptrs, za.to(z_a.dtype.element_ty), mask=mask)
            out = activation(za, ACT, alpha)
        if HAS_PROBS:
            out *= tl.load(probs + rows, mask=mask_m, other=0.0).to(tl.float32)[:, None]
        qe.store_quantized(out, rows, mask_m, off_n, F, y, stride_y, data, stride_d, scale, stride_s,
                           row_amax, SCALING, ELEM, QBLOCK, STORE_Y, BLOCK_M, BLOCK_N)


def epilogue_parts(scaling: Scaling, block_n: int) -> int:
    """Column slices of the epilogue: halves while each still holds whole quantization blocks."""
    return 2 if block_n // 2 >= max(16, BLOCK_SIZE[scaling] or 1) else 1


def _z_args(z: torch.Tensor | None, gated: bool, interleaved: bool, block_m: int, block_n: int):
    """Ragged descriptors for z's stores (``store_pair``'s layout when gated) when z can sit
    behind them, else None (pointer stores)."""
    if z is None or not grouped_tma_ok(*pair_views(z, interleaved or not gated)):
        return None
    if gated:
        return pair_args(z, interleaved, True, block_m, block_n)
    desc = ragged_descriptor(z, [block_m, block_n])
    return desc, desc


def _b_halves(b_data: torch.Tensor, gated: bool, interleaved: bool) -> list[torch.Tensor]:
    """What the descriptors cover: the gate and up halves of ``b``'s rows, or all of ``b``."""
    if gated and not interleaved:
        F = b_data.shape[1] // 2
        return [b_data[:, :F], b_data[:, F:]]
    return [b_data]


def grouped_gemm_scaled_act(
    a: Operand,
    b: Operand,
    offsets: torch.Tensor,
    *,
    act: AnyActivation,
    gated: bool = False,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    save_preact: bool = False,
    scaling: Scaling,
    element: Element,
    store_y: bool,
    out_dtype: torch.dtype,
    out: qe.Emitted | None = None,
) -> tuple[qe.Emitted, torch.Tensor | None]:
    """FC1 with the activation and FC2's input quantization in the epilogue (module docstring).

    Args:
        a: [M, K] operand (x row-wise, per-group ``outer``), rows grouped by ``offsets``.
        b: [G, N, K] operand (FC1's weight row-wise); N = 2F when ``gated``, else F.
        offsets: int64 [G + 1] device tensor; M == offsets[G] (never checked: no sync).
        act, alpha: the activation (``alpha``: SiLU's slope; the clamped gate's too).
        gated, interleaved, clamped, limit: a gated activation (``_activations.gated``).
        probs: [M] row scale of ``h`` (router probabilities) or None.
        bias: [G, N] or None.
        save_preact: also return ``z`` [M, N] in ``out_dtype``.
        scaling: the operands' format, and ``h``'s (one recipe); element, store_y: ``h``'s
            element and whether ``h`` itself is written (``quant_epilogue``).
        out_dtype: dtype of z and h. out: buffers from ``quant_epilogue.allocate`` for h [M, F].
    Returns:
        ``(emitted, z)``; ``z`` is None unless ``save_preact``.
    """
    M, G, N = a.data.shape[0], b.data.shape[0], b.data.shape[1]
    F = N // 2 if gated else N
    device = a.data.device
    if out is None:
        out = qe.allocate(M, F, out_dtype, device, scaling=scaling, element=element, store_y=store_y)
    z = torch.empty(M, N, dtype=out_dtype, device=device) if save_preact else None
    if M == 0 or F == 0:
        return out, z
    cfg = _configs()[scaling, gated]
    bm, bk = cfg.block_m, cfg.block_k
    bn = qe.tile_columns(scaling, cfg.block_n)
    a_data = a.data if a.data.stride(1) == 1 else a.data.contiguous()
    b_data = b.data if b.data.stride(2) == 1 else b.data.contiguous()
    halves = _b_halves(b_data, gated, interleaved)
    bkb = bytes_per_step(bk, scaling)
    tma = tma_ok(a_data, *halves)
    if tma:
        a_arg = TensorDescriptor.from_tensor(a_data, [bm, bkb])
        box = [1, 2 * bn if interleaved else bn, bkb]
        b_args = [TensorDescriptor.from_tensor(t, box) for t in halves]
    else:
        a_arg, b_args = a_data, [b_data]
    a_scale, b_scale = a.kernel_scale(), b.kernel_scale()
    (aog, aom), (bog, bon) = a.outer_strides(), b.outer_strides()
    y, data, scale, row_amax = qe.kernel_args(out, out_dtype, device)
    parts = epilogue_parts(scaling, bn)
    z_args = _z_args(z, gated, interleaved, bm, bn // parts)
    programs = persistent_programs(a_data, (cdiv(M, bm) + G) * cdiv(F, bn))
    launch(grouped_gemm_scaled_act_kernel, (programs,),
        a_arg, dummy_or(a_scale, y), dummy_or(a.outer, y), b_args[0], b_args[-1], dummy_or(b_scale, y),
        dummy_or(b.outer, y), offsets, dummy_or(bias, y), dummy_or(probs, y),
        *(z_args or (dummy_or(z, y),) * 2), y, data, scale, row_amax,
        G, F, a_data.shape[1],
        a_scale.shape[-1] if a_scale is not None else 0, b_scale.shape[-1] if b_scale is not None else 0,
        a_data.stride(0), b_data.stride(0), b_data.stride(1),
        a_scale.stride(0) if a_scale is not None else 0,
        b_scale.stride(0) if b_scale is not None else 0, b_scale.stride(1) if b_scale is not None else 0,
        aog, aom, bog, bon, bias.stride(0) if bias is not None else 0, z.stride(0) if z is not None else 0,
        *qe.strides(out), float(limit), float(alpha),
        SCALING=int(scaling), ELEM=int(element), QBLOCK=BLOCK_SIZE[scaling] or 1, STORE_Y=out.y is not None,
        B_ROWS_PER_SCALE=b.rows_per_scale, HAS_OUTER_A=a.outer is not None, HAS_OUTER_B=b.outer is not None,
        HAS_BIAS=bias is not None, ACT=kernel_act(act), GATED=gated, CLAMPED=clamped,
        INTERLEAVED=gated and interleaved, HAS_PROBS=probs is not None, SAVE_PREACT=save_preact, TMA=tma, TMA_Z=z_args is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m,
        BLOCK_G=max(16, next_power_of_2(G)), NUM_PROGRAMS=programs, FLATTEN=cfg.flatten,
        WARP_SPECIALIZE=cfg.warp_specialize, EPILOGUE_PARTS=parts,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out, z


def reference_grouped_gemm_scaled_act(
    a: Operand,
    b: Operand,
    offsets: torch.Tensor,
    *,
    act: AnyActivation,
    gated: bool = False,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    probs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    save_preact: bool = False,
    scaling: Scaling,
    element: Element,
    store_y: bool,
    out_dtype: torch.dtype,
    out: qe.Emitted | None = None,
) -> tuple[qe.Emitted, torch.Tensor | None]:
    """``z = reference_grouped_gemm_scaled(a, b, offsets, bias=bias)`` in ``out_dtype`` (float32
    maths); ``h = reference_gated_fwd(z, ..., probs=probs)`` when ``gated``, else
    ``reference_activation_fwd(z, act, alpha)``; returns ``quant_epilogue.reference_emit(h)``
    (copied into ``out`` when given) and ``z`` when ``save_preact``."""
    z = reference_grouped_gemm_scaled(a, b, offsets, scaling=scaling, out_dtype=out_dtype, bias=bias)
    if gated:
        h = reference_gated_fwd(z, act, interleaved=interleaved, clamped=clamped, limit=limit, alpha=alpha,
                                probs=probs)
    else:
        h = reference_activation_fwd(z, act, alpha)
    emitted = qe.reference_emit(h, scaling=scaling, element=element, store_y=store_y, out=out)
    return emitted, z if save_preact else None
