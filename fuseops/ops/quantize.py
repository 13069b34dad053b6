"""Quantize: casts the activation (forward) and/or its gradient (backward) to the active
recipe's format. Without a recipe it is the identity.

On its own the op rounds values to the format and hands the next op a plain tensor
(quantize then dequantize); when a quantized GEMM follows, a fusion hands it the
quantized storage itself (``fuseops.fusions.forward_quantize_linear``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fuseops.ops import _checks
from fuseops.ops.contract import OpContext, OpGrads, Saved, meta
from fuseops.ops.op import BasicOp
from fuseops.quant import quantize
from fuseops.quant.recipes import Recipe, TensorRole


@dataclass(frozen=True)
class QuantizeSaved(Saved):
    recipe: Recipe | None = meta()


def cast(t: torch.Tensor, recipe: Recipe, role: TensorRole) -> torch.Tensor:
    """``t`` rounded to ``recipe``'s format for ``role``, in ``t``'s dtype."""
    return quantize(t, recipe, role=role).dequantize(t.dtype)


class Quantize(BasicOp):
    """Cast to the active recipe's format.

    Args:
        forward: cast the activation (E4M3 under the FP8 recipes).
        backward: cast the gradient (E5M2 where the recipe says so).
    """

    def __init__(self, forward: bool = True, backward: bool = False) -> None:
        super().__init__()
        self.quantize_forward = _checks.flag("forward", forward)
        self.quantize_backward = _checks.flag("backward", backward)

    def extra_repr(self) -> str:
        return f"forward={self.quantize_forward}, backward={self.quantize_backward}"

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        if ctx.needs_backward:
            ctx.saved = QuantizeSaved(recipe=ctx.recipe)
        if ctx.recipe is None or not self.quantize_forward:
            return x, ()
        return cast(x, ctx.recipe, TensorRole.INPUT), ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        recipe = ctx.saved.recipe
        if recipe is None or not self.quantize_backward:
            return OpGrads(dy)
        return OpGrads(cast(dy.contiguous(), recipe, TensorRole.GRAD))
