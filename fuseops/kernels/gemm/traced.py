"""What ``torch.compile`` traces for the dense GEMMs (``dispatch.launcher`` while compiling):
the references' epilogues after a product taken in the operands' own dtype when that is
bf16 or fp16, accumulated in float32 by cuBLAS, as ``torch.nn.Linear`` under compile and our
fused kernel both accumulate.

The references multiply in float32 (they are the spec); traced as they are, inductor runs a
float32 GEMM: the 4-block GELU stack at T=16384, H=4096 took 411 ms compiled against 81 ms
eager on an H100 (``benchmarks/sizes.py``). Here the epilogue reads the product
rounded once to the operands' dtype, as the unfused ops (Linear, then the activation or the
residual add) compute it; other dtypes go to the references unchanged.

Not custom ops running the eager kernels: measured on an H100 against these traced
references, the 4-block stacks compiled that way took 4.14 / 2.91 ms (GELU H=1024 T=1024),
7.11 / 2.69 (SwiGLU H=1024 T=1024), 8.84 / 7.34 (SwiGLU H=1024 T=16384), and won only at
GELU H=2048 T=16384 (22.69 / 23.52): each op's dispatch and launcher Python costs more than
inductor's wrapper where the host bounds the step, and inductor fuses the gated epilogue
with its neighbours.
"""

from __future__ import annotations

import torch

from fuseops.kernels.gemm import dense, dense_gated

HALF = (torch.bfloat16, torch.float16)


def _half_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``a @ b (+ bias)`` in ``a``'s dtype, or None where the references' float32 is needed."""
    if a.dtype not in HALF or b.dtype != a.dtype:
        return None
    return torch.mm(a, b) if bias is None else torch.addmm(bias.to(a.dtype), a, b)


def gemm(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, **epilogue) -> tuple:
    """``dense.gemm``'s signature and outputs (``dense.reference_gemm`` is the spec)."""
    z = _half_product(a, b, bias)
    if z is None:
        return dense.reference_gemm(a, b, bias=bias, **epilogue)
    return dense.reference_gemm_epilogue(z, a.dtype, **epilogue)


def gemm_gated(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, **epilogue) -> tuple:
    """``dense_gated.gemm_gated``'s signature and outputs (its reference is the spec)."""
    z = _half_product(a, b, bias)
    if z is None:
        return dense_gated.reference_gemm_gated(a, b, bias=bias, **epilogue)
    return dense_gated.reference_gated_epilogue(z, a.dtype, **epilogue)
