"""Bias: ``y = x + bias``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops import _autocast, _checks
from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec
from fuseops.ops.op import BasicOp


@dataclass(frozen=True)
class BiasSaved(Saved):
    pass


def reduce_bias_grad(dy: torch.Tensor, size: int) -> torch.Tensor:
    """Sum of ``dy`` over every leading dim: the gradient of a bias of ``size``."""
    dy2d = dy.reshape(-1, size)
    launch = launcher(Kernel.BIAS_GRAD, dy2d)
    return launch(dy2d.contiguous())


class Bias(BasicOp):
    """``y = x + bias``.

    Args:
        size: size of the last dim (and of ``bias``).
    Shapes: x [..., size] -> y [..., size].
    """

    def __init__(self, size: int, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.size = _checks.positive_int("size", size)
        _checks.float_dtype("dtype", dtype)
        self.bias = torch.nn.Parameter(torch.empty(size, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zeros (what a model moved from the meta device with ``to_empty`` calls per module)."""
        torch.nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"size={self.size}"

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        _checks.features("Bias", x, self.size)
        _checks.matches_parameters(self, x)
        return x

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        if ctx.needs_backward:
            ctx.saved = BiasSaved()
        return x + self.compute_bias(ctx, x.dtype), ()

    def compute_bias(self, ctx: OpContext, dtype: torch.dtype) -> torch.Tensor:
        """The bias added to an input of ``dtype``: under ``torch.autocast``, cast to it
        (once per version), as the bias of ``torch.nn.Linear`` is; no promotion."""
        return _autocast.cast_param(dtype if ctx.autocast is not None else None, self.bias)

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        params = {"bias": reduce_bias_grad(dy, self.size)} if ctx.weight_requires_grad else {}
        return OpGrads(dy if ctx.input_requires_grad else None, params)
