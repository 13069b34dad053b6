"""FP8 per-tensor grouped GEMMs for Hopper, warp-specialized (Gluon): forward and dgrad.

The same products as gemm/grouped_scaled.py under ``Scaling.TENSOR`` (rows grouped by device
offsets, one scale per group and operand, applied to the result), on hopper/fp8_forward.py's
kernel without block scales: a TMA producer warp fills a ring of stages, two consumer warpgroups
take the two 64-row halves of each 128x256 output tile, each chaining its K steps into one
accumulator with one wgmma in flight while the next stage's operands are awaited. The producer
runs ahead into the next tile while the consumers finish one (the output leaves by asynchronous
TMA stores).

Why: at the Qwen3-30B-A3B expert shape the Triton kernel's FP8 GEMMs ran 0.89-1.26 PFLOP/s
(H100, session 36: FC2's forward, K = 768, the slowest), and the quantized expert layer's
GEMMs are its largest share. Measured there (``benchmarks/fp8_gemm_tiles.py``): 1.06-1.09x the
Triton kernel on FC1's and FC2's forward and dgrad, the same bits. Used where
``serves_grouped_gemm_scaled`` says (sm_90, TMA-ready operands, ``Scaling.TENSOR``, a bf16 or
fp16 result); elsewhere, and under the interpreter, the Triton kernel runs.
"""

from __future__ import annotations

import torch

from fuseops.kernels._triton import cdiv, next_power_of_2
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.hopper.fp8_forward import grouped_fp8_kernel
from fuseops.kernels.hopper.pipeline import BLOCK, HALF, descriptor, dummy_or, grouped_call, grouped_operands_ready
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

# Output tile columns and ring depth: 48 KB a stage (two 64x128 halves of A, 256x128 of B)
# and 64 KB of output staging fit 3 stages in an SM's 227 KB.
BLOCK_N = 256
STAGES = 3
GROUP_M = 8


def grouped_tensor_scaled(a: Operand, b: Operand, offsets: torch.Tensor, y: torch.Tensor,
                          bias: torch.Tensor | None, *, block_n: int = BLOCK_N, stages: int = STAGES) -> torch.Tensor:
    """grouped_gemm_scaled under ``Scaling.TENSOR`` into ``y`` [M, N]: ``a`` [M, K] float8,
    ``b`` [G, N, K] (contiguous) float8, their ``outer`` the groups' scales, ``bias`` [G, N].
    Callers check ``serves_grouped_gemm_scaled``."""
    M, (G, N, K) = a.data.shape[0], b.data.shape
    (aog, aom), (bog, bon) = a.outer_strides(), b.outer_strides()
    programs = persistent_programs(y, (cdiv(M, BLOCK) + G) * cdiv(N, block_n))
    # No block scales: y stands in for them (never read), their strides 0.
    launch(grouped_fp8_kernel, (programs,),
        descriptor(a.data, HALF), descriptor(b.data.view(G * N, K), block_n), descriptor(y, HALF, block_n),
        offsets, y, y, dummy_or(a.outer, y), dummy_or(b.outer, y), dummy_or(bias, y), y, G, N, K, 0, 0, 0, 0, 0,
        aog, aom, bog, bon, bias.stride(0) if bias is not None else 0, y.stride(0),
        BLOCK_SCALES=False, B_ROWS_PER_SCALE=1, HAS_OUTER_A=a.outer is not None, HAS_OUTER_B=b.outer is not None,
        GROUP_FACTORS=not (a.outer_per_row or b.outer_per_row), HAS_BIAS=bias is not None, ACCUMULATE=False,
        NUM_PROGRAMS=programs, STAGES=stages, GROUP_M=GROUP_M,
        BLOCK_G=max(32, next_power_of_2(G)), num_warps=4,
    )
    return y


def serves_grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                               out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                               out: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row for gemm/grouped_scaled.py's ``grouped_gemm_scaled`` under
    ``Scaling.TENSOR``: float8 operands, per-group (or per-tensor) scales, every operand TMA-ready
    (a weight strided along K is read from a contiguous copy, as the Triton launcher reads it)."""
    M, N = a.data.shape[0], b.data.shape[1]
    if scaling != Scaling.TENSOR or not (M and N) or a.outer_per_row or b.outer_per_row:
        return False
    if out_dtype not in (torch.bfloat16, torch.float16):
        # A float32 output's staging does not fit beside the ring: the Triton kernel writes it.
        return False
    return grouped_operands_ready(a.data, b.data, out, (M, N), out_dtype)


def grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                        out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/grouped_scaled.py's ``grouped_gemm_scaled`` (same arguments) on this kernel."""
    return grouped_call(grouped_tensor_scaled, a, b, offsets, out_dtype, bias, out)
