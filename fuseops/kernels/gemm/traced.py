"""What ``torch.compile`` and the ``torch.func`` transforms run for the dense GEMMs
(``dispatch.launcher`` while tracing).

Under ``torch.compile``: the kernels eager runs, as the ``fuseops::gemm`` and
``fuseops::gemm_gated`` custom ops (``gemm_op``, ``gemm_gated_op``), each choosing at run time
as eager does (dense_dispatch.py: cuBLAS and one elementwise kernel below a wave of tiles, our
fused kernel above). Traced instead (the functions below, which are also what the torch.func
transforms run), inductor compiled the product and the epilogue apart: the compiled dense
stacks ran 2-15 % slower than eager at every size on the H100 where our fused kernel is the
faster one (session 17's sizes table), e.g. GELU H=2048 T=16384: 25.7 ms against 22.3.

Traced, the references' epilogues run after a product taken in the operands' own dtype when
that is bf16 or fp16, accumulated in float32 by cuBLAS, as ``torch.nn.Linear`` under compile
and our fused kernel both accumulate. The references multiply in float32 (they are the spec);
traced as they are, inductor ran a float32 GEMM: the 4-block GELU stack at T=16384, H=4096 took
411 ms compiled against 81 ms eager on an H100 (``benchmarks/sizes.py``, session 14). Here the
epilogue reads the product rounded once to the operands' dtype, as the unfused ops (Linear,
then the activation or the residual add) compute it; other dtypes go to the references
unchanged.
"""

from __future__ import annotations

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.elementwise.activation_math import Activation
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


@fuseops_op("gemm(Tensor a, Tensor b, Tensor? bias, int act, float alpha, bool save_preact, Tensor? act_grad_input, "
            "Tensor? residual) -> (Tensor, Tensor)")
def _gemm_op(a, b, bias, act, alpha, save_preact, act_grad_input, residual):
    from fuseops.kernels.dispatch import Kernel, launcher  # dispatch.py imports this module
    y, preact = launcher(Kernel.GEMM, a)(a, b, bias=bias, act=Activation(act), alpha=alpha, save_preact=save_preact,
                                         act_grad_input=act_grad_input, residual=residual)
    return y, preact if preact is not None else a.new_empty(0)


@torch.library.register_fake("fuseops::gemm")
def _(a, b, bias, act, alpha, save_preact, act_grad_input, residual):
    y = a.new_empty(a.shape[0], b.shape[1])
    return y, a.new_empty(a.shape[0], b.shape[1]) if save_preact else a.new_empty(0)


def gemm_op(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None,
            act: Activation = Activation.IDENTITY, alpha: float = 1.0, save_preact: bool = False,
            act_grad_input: torch.Tensor | None = None, residual: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dense.gemm``'s signature and outputs, through ``fuseops::gemm`` (under ``torch.compile``)."""
    y, preact = _gemm_op(a, b, bias, int(act), float(alpha), save_preact, act_grad_input, residual)
    return (y if out is None else out.copy_(y)), (preact if save_preact else None)


@fuseops_op("gemm_gated(Tensor a, Tensor b, Tensor? bias, int act, bool interleaved, bool clamped, float limit, "
            "float alpha, bool save_preact) -> (Tensor, Tensor)")
def _gemm_gated_op(a, b, bias, act, interleaved, clamped, limit, alpha, save_preact):
    from fuseops.kernels.dispatch import Kernel, launcher  # dispatch.py imports this module
    y, preact = launcher(Kernel.GEMM_GATED, a)(a, b, bias=bias, act=Activation(act), interleaved=interleaved,
                                               clamped=clamped, limit=limit, alpha=alpha, save_preact=save_preact)
    return y, preact if preact is not None else a.new_empty(0)


@torch.library.register_fake("fuseops::gemm_gated")
def _(a, b, bias, act, interleaved, clamped, limit, alpha, save_preact):
    y = a.new_empty(a.shape[0], b.shape[1] // 2)
    return y, a.new_empty(a.shape[0], b.shape[1]) if save_preact else a.new_empty(0)


def gemm_gated_op(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, act: Activation,
                  interleaved: bool = False, clamped: bool = False, limit: float = 7.0, alpha: float = 1.0,
                  save_preact: bool = False, out: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dense_gated.gemm_gated``'s signature and outputs, through ``fuseops::gemm_gated``."""
    y, preact = _gemm_gated_op(a, b, bias, int(act), interleaved, clamped, float(limit), float(alpha), save_preact)
    return (y if out is None else out.copy_(y)), (preact if save_preact else None)
