"""The dense GEMM's epilogues unfused: cuBLAS (``torch.addmm`` / ``torch.mm``), then one
elementwise kernel. What the dispatch table runs on sm_90 instead of ``dense.gemm`` and
``dense_gated.gemm_gated`` where cuBLAS plus the elementwise kernel measured faster
(kernels/dense_dispatch.py has the measurements and the rules).

Same signatures, outputs and dtypes as ``dense.gemm`` and ``dense_gated.gemm_gated``; their
specs are the references beside them.
The GEMM accumulates in float32 inside cuBLAS (bias added in its epilogue) and writes
``z = a @ b + bias`` in ``a``'s dtype; the activation and the residual add then read that
rounded ``z`` and compute in float32 (the activation through fuseops' own Triton kernel,
the maths of the fused epilogue). So ``preact`` is what the fused kernel saves, and ``y``
differs from the fused one only by that one rounding of ``z``: exactly what the unfused basic
ops (Linear, then the activation op or the residual add) compute.
"""

from __future__ import annotations

import torch

from fuseops.kernels.elementwise.activation import activation_bwd, activation_fwd
from fuseops.kernels.elementwise.activation_math import Activation, AnyActivation
from fuseops.kernels.elementwise.gated_activation import gated_fwd


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation = Activation.IDENTITY,
    alpha: float = 1.0,
    save_preact: bool = False,
    act_grad_input: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dense.gemm``'s epilogues as cuBLAS plus one elementwise kernel: the forward ones,
    and the dgrad one (``act_grad_input``: ``dz = (a @ b) * act'(act_grad_input)``, the
    activation's backward kernel on the rounded product, as the unfused ops run it).

    Args:
        a: [M, K]; b: [K, N]; bias: [N] or None; residual, act_grad_input: [M, N] or None;
            all, and ``out`` [M, N] if given, in ``a``'s dtype (the dispatch table's ``when``
            checks this).
    Returns:
        ``(y, preact)``; ``preact`` is None unless ``save_preact``.
    """
    z = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
    y = z
    if act_grad_input is not None:
        if z.numel():
            # Into the product's own buffer where nothing else holds it: an element is read
            # before it is written, by the same program.
            y = activation_bwd(act_grad_input.contiguous(), z, act, alpha, out=None if save_preact else z)
    elif act is not Activation.IDENTITY and z.numel():
        y = activation_fwd(z, act, alpha)
    if residual is not None:
        # In place unless y is still z and z is also the saved preact (one kernel either way).
        y = y + residual if y is z and save_preact else y.add_(residual)
    if y is z and save_preact:
        # y and the preact are equal in value but two tensors, as the fused kernel returns them.
        y = z.clone()
    if out is not None:
        y = out.copy_(y)
    return y, (z if save_preact else None)


def gemm_gated(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    act: AnyActivation,
    interleaved: bool = False,
    clamped: bool = False,
    limit: float = 7.0,
    alpha: float = 1.0,
    save_preact: bool = False,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``dense_gated.gemm_gated`` as cuBLAS (``z = a @ b + bias`` [M, 2F] in ``a``'s dtype),
    then fuseops' gated activation kernel on that rounded ``z``: what the unfused Linear and
    gated activation ops compute. ``z`` is the saved pre-activation as it is.

    Args:
        a: [M, K]; b: [K, 2F]; bias: [2F] or None; ``out`` [M, F] if given; all in ``a``'s
            dtype (the dispatch table's ``when`` checks this).
    Returns:
        ``(y, preact)``; ``preact`` is None unless ``save_preact``.
    """
    z = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
    y = gated_fwd(z, act, interleaved=interleaved, clamped=clamped, limit=limit, alpha=alpha, out=out)
    return y, (z if save_preact else None)
