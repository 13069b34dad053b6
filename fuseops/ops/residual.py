"""The residual branch as two ops: ``MakeExtraOutput`` hands ``x`` out as an extra
output (the branch), ``AddExtraInput`` adds an extra input back (the residual add)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fuseops.ops import _checks
from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec
from fuseops.ops.op import BasicOp


@dataclass(frozen=True)
class NothingSaved(Saved):
    pass


class AddExtraInput(BasicOp):
    """``y = x + r`` where ``r`` (same shape and dtype as ``x``) is an extra input."""

    num_extra_inputs = 1

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        if x.autocast is None:
            _checks.extra_tensor("AddExtraInput", "extra input r", extra_inputs[0], x, x.shape)
            return x
        # Under torch.autocast the add promotes, as ``x + r`` does (a float32 residual
        # stream around bfloat16 GEMMs stays float32).
        floats = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
        _checks.extra_tensor("AddExtraInput", "extra input r", extra_inputs[0], x, x.shape, dtypes=floats)
        return x.with_dtype(torch.promote_types(x.dtype, extra_inputs[0].dtype))

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        if ctx.needs_backward:
            ctx.saved = NothingSaved()
        return x + extra_inputs[0], ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        dr = dy if ctx.extra_requires_grad[0] else None
        return OpGrads(dy if ctx.input_requires_grad else None, {}, (dr,))


class MakeExtraOutput(BasicOp):
    """``y = x``, and ``x`` is also returned as an extra output (the residual branch)."""

    num_extra_outputs = 1

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        if ctx.needs_backward:
            ctx.saved = NothingSaved()
        return x, (x,)

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        if not ctx.input_requires_grad:
            return OpGrads(None)
        (dbranch,) = extra_output_grads
        return OpGrads(dy if dbranch is None else dy + dbranch)
