"""The FP8 blockwise grouped weight gradient for Hopper, warp-specialized (Gluon):
grouped_gemm_scaled_wgrad under ``Scaling.BLOCK``, ``dw[g] = a[:, steps of g] @ b[:, steps of
g]^T`` over the padded grouped layout (each group's rows start on a 128 boundary), written to
``dw`` or added to it.

On hopper/fp8_wgrad.py's kernel with block scales: two consumer warpgroups take the 64-row
halves of each [128, 128] tile of ``dw[g]`` and rescale each step's product by its step-major
1x128 scales on both sides. Measured on an H100 (benchmarks/quantize.py, E=8 T=16384
4096x14336): 923 TFLOP/s against the Triton kernel's 453.
"""

from __future__ import annotations

import torch

from fuseops.kernels._triton import cdiv
from fuseops.kernels.gemm.grouped import persistent_programs
from fuseops.kernels.gemm.wgrad_walk import n_fastest
from fuseops.kernels.hopper.blockwise import usable
from fuseops.kernels.hopper.fp8_wgrad import grouped_fp8_wgrad_kernel
from fuseops.kernels.hopper.pipeline import BLOCK, HALF, descriptor, dummy_or, dw_descriptor, wgrad_call
from fuseops.kernels.launch import launch
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand

# Ring stages by ``accumulate``. Writing dw: 5 (+1-14 % over 4 at the MoE shapes, H100; 225 KB
# of shared memory with a float32 dw staged for TMA). Into main_grad: 4 (192 KB with its staging).
RING_STAGES = {False: 5, True: 4}


def grouped_blockwise_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, dw: torch.Tensor,
                            accumulate: bool, along_n: bool | None = None) -> torch.Tensor:
    """grouped_gemm_scaled_wgrad under ``Scaling.BLOCK`` into ``dw`` [G, N, K] (added to it
    when ``accumulate``): ``a`` [N, P] and ``b`` [K, P] with 1x128 scales along P.
    ``along_n``: the walk order (tests), else wgrad_walk.n_fastest's."""
    G, N, K = dw.shape
    programs = persistent_programs(dw, G * cdiv(N, BLOCK) * cdiv(K, BLOCK))
    if along_n is None:
        along_n = n_fastest(N, K, BLOCK, BLOCK, programs)
    dw_desc, dw_tma = dw_descriptor(dw, BLOCK)
    # Step-major scales: a step's 128 + 128 of a tile are contiguous, not a sector each
    # (the scales are 1/32 of the operands' bytes).
    a_scale, b_scale = a.scale.t().contiguous(), b.scale.t().contiguous()
    launch(grouped_fp8_wgrad_kernel, (programs,),
        descriptor(a.data, HALF), descriptor(b.data, BLOCK), dw_desc, offsets, a_scale, b_scale,
        dummy_or(a.outer, dw), dummy_or(b.outer, dw), dw, G, N, K, a_scale.stride(0), b_scale.stride(0),
        a.outer_strides()[0], b.outer_strides()[0], dw.stride(0), dw.stride(1),
        BLOCK_SCALES=True, HAS_OUTER=a.outer is not None, ACCUMULATE=accumulate, DW_TMA=dw_tma,
        NUM_PROGRAMS=programs, STAGES=RING_STAGES[accumulate], N_FASTEST=along_n, num_warps=4,
    )
    return dw


def serves(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling, out_dtype: torch.dtype,
           main_grad: torch.Tensor | None = None, out: torch.Tensor | None = None) -> bool:
    """The dispatch table's sm_90 row: FP8 blockwise with TMA-ready operands and a non-empty dw."""
    G, N, K = offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0]
    return scaling == Scaling.BLOCK and bool(G and N and K) and usable(a.data, b.data)


def grouped_gemm_scaled_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                              out_dtype: torch.dtype, main_grad: torch.Tensor | None = None,
                              out: torch.Tensor | None = None) -> torch.Tensor:
    """gemm/grouped_scaled_wgrad.py's ``grouped_gemm_scaled_wgrad`` (same arguments) on this kernel."""
    return wgrad_call(grouped_blockwise_wgrad, a, b, offsets, out_dtype, main_grad, out)
