"""Dense GEMM on quantized operands: ``y = dequant(a) @ dequant(b)^T (+ bias)``.

Both operands are rows quantized along K, the reduction dim (the NT form): a [M, K], b [N, K].
The Linear forward passes x and the weight row-wise, dgrad dy row-wise and the weight's
column-wise copy, wgrad the column-wise copies of dy and x. Per ``Scaling``
(quantization/formats.py):

- TENSOR: float8 tiles go straight into ``tl.dot`` (Hopper's FP8 tensor cores; E4M3 x E5M2 is
  allowed), and the float32 result is scaled once in the epilogue by ``a.outer[row] *
  b.outer[col]`` (per tensor, or per row).
- BLOCK: one float8 ``tl.dot`` per 128-long K step, its partial product scaled by the rows'
  1x128 (or 128x128) block scales and added in float32 (no long low-precision accumulation).
- MX, NVFP4: no Hopper hardware, so emulated: each tile is dequantized in registers (element
  times its E8M0 / E4M3 block scale, exact in bfloat16) and multiplied on the bf16 tensor
  cores; NVFP4's tensor scales go in the epilogue.

Tiling: a persistent grid of one program per SM walks the [BLOCK_M, BLOCK_N] output tiles in
bands of GROUP_M M-tiles (gemm/dense.py); operands come through TMA descriptors when their rows are
16-byte aligned, else through masked pointer loads; block scales through pointer loads.

On sm_90, BLOCK with TMA-ready operands runs as one group of the warp-specialized Gluon
kernel instead (hopper/blockwise.py): 1.3-1.7x this kernel's forward (H100,
16384 x 4096 x 14336 and 16384 x 14336 x 4096).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fuseops.kernels._triton import INTERPRET, cdiv, device_sms, dot
from fuseops.kernels.dtypes import as_dtype
from fuseops.kernels.gemm.dense import swizzle, tma_ok
from fuseops.kernels.gemm.grouped import GemmConfig
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling, reference_dequantize, unpack_e2m1
from fuseops.kernels.quantization.operand import Operand


@functools.cache
def _configs() -> dict[tuple[Scaling, str], GemmConfig]:
    """Tile shapes by (format, path): ``tma`` operands, ``pointer`` (unaligned rows) and
    ``accumulate`` (a float32 tile in the epilogue: ``main_grad`` or a float32 output).
    BLOCK_K is the 128-long block for BLOCK; MX and NVFP4 dequantize [*, 64] tiles in registers.

    The GPU entries are the largest tiles that compile for sm_90 within 227 KB of shared memory
    and without register spills (``triton.compile`` for sm_90 and cuobjdump, no GPU needed);
    they are not yet timed: ``python -m benchmarks.quantize --tune`` times the candidates.
    """
    if INTERPRET:
        # Blockwise runs two programs per "SM" here, so the CPU tests cover that grid too.
        small = {s: GemmConfig(64, 64, 128 if s == Scaling.BLOCK else 64, 2, 4, 1,
                               programs_per_sm=2 if s == Scaling.BLOCK else 1) for s in Scaling}
        return {(s, path): cfg for s, cfg in small.items() for path in ("tma", "pointer", "accumulate")}
    return {
        (Scaling.TENSOR, "tma"): GemmConfig(128, 256, 128, 8, 8, 3),
        (Scaling.TENSOR, "accumulate"): GemmConfig(128, 128, 128, 8, 8, 4),
        (Scaling.TENSOR, "pointer"): GemmConfig(128, 128, 128, 8, 8, 3),
        # The per-step rescale holds a second accumulator: no cross-tile software pipelining.
        (Scaling.BLOCK, "tma"): GemmConfig(128, 128, 128, 8, 8, 3, flatten=False),
        (Scaling.BLOCK, "accumulate"): GemmConfig(128, 128, 128, 8, 8, 3, flatten=False),
        (Scaling.BLOCK, "pointer"): GemmConfig(128, 128, 128, 8, 8, 3, flatten=False),
        (Scaling.MX, "tma"): GemmConfig(128, 128, 64, 8, 8, 3),
        (Scaling.MX, "accumulate"): GemmConfig(128, 128, 64, 8, 8, 3),
        (Scaling.MX, "pointer"): GemmConfig(128, 128, 128, 8, 8, 3),
        (Scaling.NVFP4, "tma"): GemmConfig(128, 128, 64, 8, 8, 3),
        (Scaling.NVFP4, "accumulate"): GemmConfig(128, 128, 64, 8, 8, 3),
        (Scaling.NVFP4, "pointer"): GemmConfig(128, 128, 64, 8, 8, 3),
    }


def pick_config(scaling: Scaling, tma: bool, float32_tile: bool = False) -> GemmConfig:
    """``float32_tile``: the epilogue reads or writes float32 (main_grad, a float32 output);
    its staging of a 128x256 float32 tile does not fit beside 3 stages of the wide config."""
    return _configs()[scaling, "pointer" if not tma else "accumulate" if float32_tile else "tma"]


@triton.jit
def load_raw(t, rows, mask_r, stride_r, ki, KB, SCALING: tl.constexpr, BLOCK_K: tl.constexpr):
    """[rows, BLOCK_K elements] of quantized data at K step ``ki`` through pointers, zeros outside."""
    BKB: tl.constexpr = BLOCK_K // 2 if SCALING == 3 else BLOCK_K
    offs_k = ki * BKB + tl.arange(0, BKB)
    mask = mask_r[:, None] & (offs_k < KB)[None, :]
    # [BLOCK_R, BKB]
    return tl.load(t + rows[:, None] * stride_r + offs_k[None, :], mask=mask, other=0.0)


@triton.jit
def dequantize_tile(raw, s, rows, mask_r, stride_s, ki, KS, SCALING: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """The operand tile as ``tl.dot`` takes it: float8 as stored (TENSOR, BLOCK), or
    bfloat16 values times their block scales (MX, NVFP4; exact: at most 5 significant bits)."""
    if SCALING == 2:
        offs_s = ki * (BLOCK_K // 32) + tl.arange(0, BLOCK_K // 32)
        mask = mask_r[:, None] & (offs_s < KS)[None, :]
        # [BLOCK_R, BLOCK_K // 32]
        codes = tl.load(s + rows[:, None] * stride_s + offs_s[None, :], mask=mask, other=127)
        v = tl.reshape(raw.to(tl.float32), [BLOCK_R, BLOCK_K // 32, 32])
        # E8M0 code c is 2 ** (c - 127): the float32 with exponent bits c.
        v = v * (codes.to(tl.int32) << 23).to(tl.float32, bitcast=True)[:, :, None]
        tile = tl.reshape(v, [BLOCK_R, BLOCK_K]).to(tl.bfloat16)
    elif SCALING == 3:
        offs_s = ki * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
        mask = mask_r[:, None] & (offs_s < KS)[None, :]
        # [BLOCK_R, BLOCK_K // 16]
        sb = tl.load(s + rows[:, None] * stride_s + offs_s[None, :], mask=mask, other=0.0).to(tl.float32)
        v = tl.reshape(unpack_e2m1(raw, BLOCK_R, BLOCK_K), [BLOCK_R, BLOCK_K // 16, 16]) * sb[:, :, None]
        tile = tl.reshape(v, [BLOCK_R, BLOCK_K]).to(tl.bfloat16)
    else:
        tile = raw
    return tile


@triton.jit
def accumulate(acc, a_tile, b_tile, a_scale, b_scale, a_rows, b_rows, mask_a, mask_b, stride_as,
               stride_bs, ki, SCALING: tl.constexpr, A_ROWS_PER_SCALE: tl.constexpr,
               B_ROWS_PER_SCALE: tl.constexpr):
    """``acc + a_tile @ b_tile^T``; for BLOCK, the K step's product times its block scales.
    Dequantized float32 tiles multiply in IEEE precision whatever torch's float32 matmul
    setting: they stand for the quantized operands, not a user's float32 tensors."""
    if SCALING == 1:
        sa = tl.load(a_scale + (a_rows // A_ROWS_PER_SCALE) * stride_as + ki, mask=mask_a, other=0.0)
        sb = tl.load(b_scale + (b_rows // B_ROWS_PER_SCALE) * stride_bs + ki, mask=mask_b, other=0.0)
        part = dot(a_tile, tl.trans(b_tile), tl.zeros(acc.shape, dtype=tl.float32), "ieee")
        return acc + part * (sa[:, None] * sb[None, :])
    return dot(a_tile, tl.trans(b_tile), acc, "ieee")


@triton.jit
def gemm_scaled_kernel(
    a, a_scale, a_outer, b, b_scale, b_outer, y, bias,
    M, N, KB, KS_A, KS_B, num_programs,
    stride_am, stride_bn, stride_asm, stride_bsn, stride_aom, stride_bon, stride_ym,
    SCALING: tl.constexpr, A_ROWS_PER_SCALE: tl.constexpr, B_ROWS_PER_SCALE: tl.constexpr,
    HAS_OUTER_A: tl.constexpr, HAS_OUTER_B: tl.constexpr, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    # KB: bytes per row of data; BKB: bytes per K step (NVFP4 packs two elements per byte).
    BKB: tl.constexpr = BLOCK_K // 2 if SCALING == 3 else BLOCK_K
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(KB, BKB)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, num_programs, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = swizzle(tile, tiles_m, tiles_n, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_m = offs_m < M
        mask_n = offs_n < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            if TMA:
                a_raw = a.load([pid_m * BLOCK_M, ki * BKB])
                b_raw = b.load([pid_n * BLOCK_N, ki * BKB])
            else:
                a_raw = load_raw(a, offs_m, mask_m, stride_am, ki, KB, SCALING, BLOCK_K)
                b_raw = load_raw(b, offs_n, mask_n, stride_bn, ki, KB, SCALING, BLOCK_K)
            a_tile = dequantize_tile(a_raw, a_scale, offs_m, mask_m, stride_asm, ki, KS_A, SCALING,
                                     BLOCK_M, BLOCK_K)
            b_tile = dequantize_tile(b_raw, b_scale, offs_n, mask_n, stride_bsn, ki, KS_B, SCALING,
                                     BLOCK_N, BLOCK_K)
            acc = accumulate(acc, a_tile, b_tile, a_scale, b_scale, offs_m, offs_n, mask_m, mask_n,
                             stride_asm, stride_bsn, ki, SCALING, A_ROWS_PER_SCALE, B_ROWS_PER_SCALE)
        if HAS_OUTER_A:
            acc *= tl.load(a_outer + offs_m * stride_aom, mask=mask_m, other=0.0)[:, None]
        if HAS_OUTER_B:
            acc *= tl.load(b_outer + offs_n * stride_bon, mask=mask_n, other=0.0)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y + offs_m[:, None] * stride_ym + offs_n[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
        if ACCUMULATE:
            acc += tl.load(y_ptrs, mask=mask, other=0.0)
        tl.store(y_ptrs, acc.to(y.dtype.element_ty), mask=mask)


def _descriptor(op: Operand, block_rows: int, scaling: Scaling, block_k: int) -> TensorDescriptor:
    bkb = block_k // 2 if scaling == Scaling.NVFP4 else block_k
    return TensorDescriptor.from_tensor(op.data, [block_rows, bkb])


def gemm_scaled(
    a: Operand,
    b: Operand,
    *,
    scaling: Scaling,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    main_grad: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``dequant(a) @ dequant(b)^T (+ bias)`` (module docstring).

    Args:
        a: [M, K] operand; b: [N, K] operand, both quantized along K in ``scaling``.
        out_dtype: dtype of the result (float32, float16 or bfloat16).
        bias: [N] or None.
        main_grad: float32 [M, N] to add the product into (and return), or None.
        out: [M, N] to write into, else allocated.
    Returns:
        y [M, N].
    """
    cfg = pick_config(scaling, tma_ok(a.data, b.data), main_grad is not None or out_dtype == torch.float32)
    return launch_gemm_scaled(a, b, scaling, out_dtype, bias, main_grad, out, cfg)


def launch_gemm_scaled(a: Operand, b: Operand, scaling: Scaling, out_dtype: torch.dtype,
                       bias: torch.Tensor | None, main_grad: torch.Tensor | None,
                       out: torch.Tensor | None, cfg: GemmConfig) -> torch.Tensor:
    """``gemm_scaled`` with an explicit tile config (what the benchmark's sweep calls)."""
    M, N = a.data.shape[0], b.data.shape[0]
    if main_grad is not None:
        y = main_grad
    else:
        y = out if out is not None else torch.empty(M, N, dtype=out_dtype, device=a.data.device)
    if M == 0 or N == 0:
        return y
    a_data = a.data if a.data.stride(1) == 1 else a.data.contiguous()
    b_data = b.data if b.data.stride(1) == 1 else b.data.contiguous()
    a, b = dataclasses.replace(a, data=a_data), dataclasses.replace(b, data=b_data)
    tma = tma_ok(a.data, b.data)
    a_arg = _descriptor(a, cfg.block_m, scaling, cfg.block_k) if tma else a.data
    b_arg = _descriptor(b, cfg.block_n, scaling, cfg.block_k) if tma else b.data
    a_scale, b_scale = a.kernel_scale(), b.kernel_scale()
    tiles = cdiv(M, cfg.block_m) * cdiv(N, cfg.block_n)
    programs = max(1, min(cfg.programs_per_sm * device_sms(a.data), tiles))
    launch(gemm_scaled_kernel, (programs,),
        a_arg, a_scale if a_scale is not None else y, a.outer if a.outer is not None else y,
        b_arg, b_scale if b_scale is not None else y, b.outer if b.outer is not None else y,
        y, bias if bias is not None else y,
        M, N, a.data.shape[1],
        a_scale.shape[1] if a_scale is not None else 0, b_scale.shape[1] if b_scale is not None else 0,
        programs,
        a.data.stride(0), b.data.stride(0),
        a_scale.stride(0) if a_scale is not None else 0, b_scale.stride(0) if b_scale is not None else 0,
        a.outer_strides()[1], b.outer_strides()[1], y.stride(0),
        SCALING=int(scaling), A_ROWS_PER_SCALE=a.rows_per_scale, B_ROWS_PER_SCALE=b.rows_per_scale,
        HAS_OUTER_A=a.outer is not None, HAS_OUTER_B=b.outer is not None, HAS_BIAS=bias is not None, ACCUMULATE=main_grad is not None, TMA=tma,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        FLATTEN=cfg.flatten, WARP_SPECIALIZE=cfg.warp_specialize,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y


def reference_operand(op: Operand, scaling: Scaling) -> torch.Tensor:
    """float32 [.., R, K] values of an operand: elements x block scales x ``outer``
    (per tensor, per group of a stacked [G, R, K] operand, or per row)."""
    v = reference_dequantize(op.data, op.scale, scaling, op.rows_per_scale)
    if op.outer is None:
        return v
    outer = op.outer.float()
    if op.outer_per_row:
        return v * outer[..., None]
    return v * (outer.view(-1, 1, 1) if v.dim() == 3 else outer.view(1, 1))


def reference_gemm_scaled(
    a: Operand,
    b: Operand,
    *,
    scaling: Scaling,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
    main_grad: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """In float32: ``y = A @ B^T (+ bias)`` with A, B the operands' values
    (``reference_operand``: elements x block scales x tensor or row scales), cast to
    ``out_dtype`` (or written into ``out``); with ``main_grad``: ``main_grad += y``, returned."""
    y = reference_operand(a, scaling) @ reference_operand(b, scaling).T
    if bias is not None:
        y = y + bias.float()
    if main_grad is not None:
        return main_grad.add_(y)
    if out is not None:
        return out.copy_(y)
    return as_dtype(y, out_dtype)
