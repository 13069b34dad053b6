"""The quantized GEMMs of Linear and GroupedLinear under a recipe.

Forward quantizes the input and the weight (row-wise, for ``x @ w^T``), keeping the
column-wise copies that backward reduces over: the input's for the weight gradient,
the weight's for the input gradient. Backward quantizes the output gradient (E5M2
where the recipe says so) and runs dgrad and wgrad on the saved copies. Grouped inputs
carry their device offsets, so every group gets its own scales with no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fuseops.ops.contract import Saved, activation, meta, parameter
from fuseops.quant import linear_dgrad, linear_forward, linear_wgrad, quantize
from fuseops.quant.recipes import Recipe, TensorRole
from fuseops.quant.storage import QuantizedTensor


@dataclass(frozen=True)
class QuantizedLinearSaved(Saved):
    # Column-wise copies only: what wgrad and dgrad reduce over.
    x: QuantizedTensor | None = activation()
    # Derived from a parameter and rebuilt every step: never offloaded.
    weight: QuantizedTensor | None = parameter()
    recipe: Recipe | None = meta()
    offsets: torch.Tensor | None = meta()


def quantized_forward(
    recipe: Recipe,
    x2d: torch.Tensor | QuantizedTensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    need_dgrad: bool,
    need_wgrad: bool,
    offsets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, QuantizedLinearSaved]:
    """``x @ weight^T + bias`` (per group with ``offsets``) and what backward needs.

    ``x2d`` may arrive already quantized (a producer emitted it); it must then hold the
    column-wise copy when the weight gradient is needed.
    """
    qx, qw, saved = quantized_operands(recipe, x2d, weight, need_dgrad=need_dgrad, need_wgrad=need_wgrad,
                                       offsets=offsets)
    y = linear_forward(qx, qw, bias=bias, out_dtype=weight.dtype)
    return y, saved


def quantized_operands(
    recipe: Recipe,
    x2d: torch.Tensor | QuantizedTensor,
    weight: torch.Tensor,
    *,
    need_dgrad: bool,
    need_wgrad: bool,
    offsets: torch.Tensor | None = None,
) -> tuple[QuantizedTensor, QuantizedTensor, QuantizedLinearSaved]:
    """The forward GEMM's operands (row-wise, plus the column-wise copies backward reduces
    over) and the saved state: ``quantized_forward`` without its GEMM, for a fused op that
    runs the GEMM with its own epilogue."""
    if isinstance(x2d, QuantizedTensor):
        qx = x2d
    else:
        qx = quantize(x2d, recipe, role=TensorRole.INPUT, rowwise=True, columnwise=need_wgrad, offsets=offsets)
    qw = quantize(weight, recipe, role=TensorRole.WEIGHT, rowwise=True, columnwise=need_dgrad)
    saved = QuantizedLinearSaved(
        x=qx.keep(rowwise=False, columnwise=True) if need_wgrad else None,
        weight=qw.keep(rowwise=False, columnwise=True) if need_dgrad else None,
        recipe=recipe,
        offsets=offsets,
    )
    return qx, qw, saved


def quantize_grad(
    saved: QuantizedLinearSaved, dy2d: torch.Tensor, *, need_dgrad: bool, need_wgrad: bool
) -> QuantizedTensor:
    """The output gradient in the recipe's gradient format: row-wise for dgrad,
    column-wise for wgrad."""
    return quantize(
        dy2d, saved.recipe, role=TensorRole.GRAD, rowwise=need_dgrad, columnwise=need_wgrad, offsets=saved.offsets
    )


def quantized_wgrad(
    saved: QuantizedLinearSaved, qdy: QuantizedTensor, *, out_dtype: torch.dtype, main_grad: torch.Tensor | None
) -> torch.Tensor | None:
    """``dy^T @ x``; added into ``main_grad`` (and None returned) when given."""
    dw = linear_wgrad(qdy, saved.x, out_dtype=out_dtype, main_grad=main_grad)
    return None if main_grad is not None else dw


def quantized_backward(
    saved: QuantizedLinearSaved,
    dy2d: torch.Tensor,
    *,
    need_dgrad: bool,
    need_wgrad: bool,
    main_grad: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dx, dw)``; ``dw`` is added into ``main_grad`` (and returned as None) when given."""
    qdy = quantize_grad(saved, dy2d, need_dgrad=need_dgrad, need_wgrad=need_wgrad)
    dx = linear_dgrad(qdy, saved.weight) if need_dgrad else None
    dw = quantized_wgrad(saved, qdy, out_dtype=dy2d.dtype, main_grad=main_grad) if need_wgrad else None
    return dx, dw
