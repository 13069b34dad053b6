"""The quantized GEMMs of Linear and GroupedLinear under a recipe.

Forward quantizes the input and the weight (row-wise, for ``x @ w^T``), keeping the
column-wise copies that backward reduces over: the input's for the weight gradient,
the weight's for the input gradient. Backward quantizes the output gradient (E5M2
where the recipe says so) and runs dgrad and wgrad on the saved copies. Grouped inputs
carry their device offsets, so every group gets its own scales with no host sync.

The quantized weight comes from ``fuseops.quant.weight_cache``: made once per weight
version (keyed by the weight's format and whether it holds the column-wise copy), so the
micro-batches of one optimizer step, activation recompute and the backward share it; the
recipe's ``cache_weights=False`` quantizes at every use. The weight is whatever tensor the
op multiplies by: under tensor parallelism each rank's local shard, cached per shard.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch

from fuseops.ops.contract import Saved, activation, meta, parameter
from fuseops.quant import linear_dgrad, linear_forward, linear_wgrad, quantize, weight_cache
from fuseops.quant.recipes import QuantFormat, Recipe, TensorRole
from fuseops.quant.storage import QuantizedTensor


@dataclass(frozen=True)
class QuantizedLinearSaved(Saved):
    # Column-wise copies only: what wgrad and dgrad reduce over.
    x: QuantizedTensor | None = activation()
    # Derived from a parameter (the weight cache's copy, shared by every micro-batch): never offloaded.
    weight: QuantizedTensor | None = parameter()
    recipe: Recipe | None = meta()
    offsets: torch.Tensor | None = meta()


class WeightCopy(enum.Enum):
    """The kind of a cached quantized weight (``weight_cache`` key, with format and layout)."""

    QUANTIZED = "quantized"


def weight_kind(fmt: QuantFormat, columnwise: bool) -> tuple[WeightCopy, QuantFormat, bool]:
    """The cache key of a weight quantized to ``fmt`` (row-wise, plus the column-wise copy
    with ``columnwise``). Only the weight's format counts: recipes that differ elsewhere
    (the gradients' dtype) share it."""
    return (WeightCopy.QUANTIZED, fmt, columnwise)


def _quantize_weight(recipe: Recipe, columnwise: bool, weight: torch.Tensor) -> QuantizedTensor:
    return quantize(weight, recipe, role=TensorRole.WEIGHT, rowwise=True, columnwise=columnwise)


def quantized_weight(recipe: Recipe, weight: torch.Tensor, *, columnwise: bool) -> QuantizedTensor:
    """``weight`` quantized for the forward GEMM (row-wise) and, with ``columnwise``, for
    dgrad; from the weight cache unless ``recipe.cache_weights`` is False. A cached copy
    holding the column-wise copy also serves a row-wise request (the same row-wise bytes)."""
    fmt = recipe.format(TensorRole.WEIGHT)
    if recipe.cache_weights and not columnwise:
        both = weight_cache.lookup(weight, weight_kind(fmt, True))
        if both is not None:
            return both
    build = functools.partial(_quantize_weight, recipe, columnwise)
    return weight_cache.derived(weight, weight_kind(fmt, columnwise), build, enabled=recipe.cache_weights)


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
    qw = quantized_weight(recipe, weight, columnwise=need_dgrad)
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
    wgrad_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dx, dw)``; ``dw`` in ``wgrad_dtype`` (the parameter's; default dy's), or added into
    ``main_grad`` (and returned as None) when given."""
    qdy = quantize_grad(saved, dy2d, need_dgrad=need_dgrad, need_wgrad=need_wgrad)
    dx = linear_dgrad(qdy, saved.weight) if need_dgrad else None
    dw = (quantized_wgrad(saved, qdy, out_dtype=wgrad_dtype or dy2d.dtype, main_grad=main_grad)
          if need_wgrad else None)
    return dx, dw
