"""FP8 blockwise grouped GEMMs for Hopper, warp-specialized (Gluon): forward and dgrad.

The same products as gemm/grouped_scaled.py under ``Scaling.BLOCK`` (forward / dgrad over
rows grouped by device offsets), on hopper/fp8_forward.py's kernel with block scales: each
consumer warpgroup waits only for its own K step's product and rescales it while the other's
MMAs run, where Triton 3.6 makes all warps wait and rescale in lockstep while the tensor cores
idle. Measured on an H100 (``benchmarks/quantize.py``, E=8 T=16384 4096x14336): forward 1052
TFLOP/s against the Triton kernel's 642.

Used on sm_90 when every operand can sit behind a TMA descriptor (``usable``); elsewhere,
and under the interpreter, the Triton kernels run. gemm/dense_scaled.py's dense BLOCK GEMMs run here
as one group (``dense_blockwise``; the dense wgrad as a forward with per-row scales on both
operands). The wgrad is hopper/blockwise_wgrad.py; the pipeline pieces the kernels share
(tile walk, ring, steps, epilogue) are hopper/pipeline.py.
"""

from __future__ import annotations

import dataclasses

import torch

from fuseops.kernels._triton import cdiv, next_power_of_2
from fuseops.kernels.gemm.dense import fresh_tma_ok, tma_ok
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.hopper.fp8_forward import grouped_fp8_kernel
from fuseops.kernels.hopper.pipeline import (
    BLOCK,
    HALF,
    descriptor,
    dummy_or,
    grouped_call,
    grouped_operands_ready,
    on_sm90,
)
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

STAGES = 4
GROUP_M = 8


def usable(*tensors: torch.Tensor | None) -> bool:
    """Whether these operands take the warp-specialized kernels: CUDA sm_90, every tensor
    behind a TMA descriptor (last dim contiguous, 16-byte aligned rows)."""
    return on_sm90(tensors[0]) and tma_ok(*tensors)


def grouped_blockwise(a: Operand, b: Operand, offsets: torch.Tensor, y: torch.Tensor,
                      bias: torch.Tensor | None, accumulate: bool = False) -> torch.Tensor:
    """grouped_gemm_scaled under ``Scaling.BLOCK`` into ``y`` [M, N] (added to it with
    ``accumulate``): ``a`` [M, K] with 1x128 scales, ``b`` [G, N, K] (contiguous) with
    128x128 or 1x128 scales, ``bias`` [G, N]. Callers check ``usable``."""
    M, (G, N, K) = a.data.shape[0], b.data.shape
    (aog, aom), (bog, bon) = a.outer_strides(), b.outer_strides()
    programs = persistent_programs(y, (cdiv(M, BLOCK) + G) * cdiv(N, BLOCK))
    a_scale, b_scale = a.scale, b.scale
    if b.rows_per_scale == 1:
        # Per-column scales (the dense wgrad): step-major as in the grouped wgrad, a step's
        # contiguous (H100, 16384 rows 14336x4096: 776 -> 846 TFLOP/s). The forward and dgrad
        # keep a's row-major: each thread's row scales stay in L1 from step to step
        # (step-major a: 1016 -> 959 TFLOP/s).
        a_scale = a.scale.t().contiguous().t()
        b_scale = b.scale.transpose(1, 2).contiguous().transpose(1, 2)
    launch(grouped_fp8_kernel, (programs,),
        descriptor(a.data, HALF), descriptor(b.data.view(G * N, K), BLOCK), descriptor(y, HALF), offsets,
        a_scale, b_scale, dummy_or(a.outer, y), dummy_or(b.outer, y), dummy_or(bias, y), y, G, N, K,
        a_scale.stride(0), b_scale.stride(0), b_scale.stride(1), a_scale.stride(1), b_scale.stride(2),
        aog, aom, bog, bon,
        bias.stride(0) if bias is not None else 0, y.stride(0),
        B_ROWS_PER_SCALE=b.rows_per_scale, HAS_OUTER_A=a.outer is not None,
        HAS_OUTER_B=b.outer is not None, HAS_BIAS=bias is not None, ACCUMULATE=accumulate,
        NUM_PROGRAMS=programs, STAGES=STAGES, GROUP_M=GROUP_M,
        BLOCK_G=max(32, next_power_of_2(G)), num_warps=4,
    )
    return y


def dense_blockwise(a: Operand, b: Operand, y: torch.Tensor, bias: torch.Tensor | None,
                    accumulate: bool) -> torch.Tensor:
    """gemm_scaled under ``Scaling.BLOCK`` (forward, dgrad, and wgrad from the column-wise
    copies) as one group: ``a`` [M, K] with 1x128 scales, ``b`` [N, K] (contiguous) with
    128x128 or 1x128 scales, into ``y`` [M, N] (added to it with ``accumulate``)."""
    M = a.data.shape[0]
    # [0, M] made on the device (no host copy, so it also captures in a CUDA graph).
    offsets = torch.arange(0, 2 * M, M, device=y.device)
    b = dataclasses.replace(b, data=b.data.unsqueeze(0), scale=b.scale.unsqueeze(0),
                            outer=None if b.outer is None else b.outer.view(1, -1))
    return grouped_blockwise(a, b, offsets, y, None if bias is None else bias.view(1, -1), accumulate)


def serves_gemm_scaled(a: Operand, b: Operand, *, scaling: Scaling, out_dtype: torch.dtype,
                       bias: torch.Tensor | None = None, main_grad: torch.Tensor | None = None,
                       out: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row for gemm/dense_scaled.py's ``gemm_scaled``: FP8
    blockwise with 1x128 scales on ``a`` and every operand TMA-ready."""
    M, N = a.data.shape[0], b.data.shape[0]
    if scaling != Scaling.BLOCK or a.rows_per_scale != 1 or not (M and N) or not b.data.is_contiguous():
        return False
    y = main_grad if main_grad is not None else out
    return usable(a.data, b.data) and (tma_ok(y) if y is not None else fresh_tma_ok((M, N), out_dtype))


def gemm_scaled(a: Operand, b: Operand, *, scaling: Scaling, out_dtype: torch.dtype,
                bias: torch.Tensor | None = None, main_grad: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/dense_scaled.py's ``gemm_scaled`` (same arguments) on this kernel."""
    y = main_grad
    if y is None:
        y = out if out is not None else torch.empty(a.data.shape[0], b.data.shape[0], dtype=out_dtype,
                                                    device=a.data.device)
    return dense_blockwise(a, b, y, bias, accumulate=main_grad is not None)


def serves_grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                               out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                               out: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row for gemm/grouped_scaled.py's ``grouped_gemm_scaled``: FP8
    blockwise with every operand TMA-ready (a weight strided along K is read from a
    contiguous copy, as the Triton launcher reads it)."""
    M, N = a.data.shape[0], b.data.shape[1]
    if scaling != Scaling.BLOCK or not (M and N):
        return False
    return grouped_operands_ready(a.data, b.data, out, (M, N), out_dtype)


def grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                        out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/grouped_scaled.py's ``grouped_gemm_scaled`` (same arguments) on this kernel."""
    return grouped_call(grouped_blockwise, a, b, offsets, out_dtype, bias, out)
