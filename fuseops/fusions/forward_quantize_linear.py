"""Quantize + Linear (or GroupedLinear), forward: the GEMM takes the quantized storage
that the cast produced, instead of the cast's rounded copy that it would quantize again.
The cast also writes the column-wise copy the weight gradient needs, in the same pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fuseops.fusions._producer_quantize import local_gemm
from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, quantized
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.ops.quantize import Quantize, QuantizeSaved
from fuseops.quant import quantize
from fuseops.quant.recipes import TensorRole


class ForwardQuantizeLinear(Fusion):
    pattern = (
        match(Quantize, where=lambda op: op.quantize_forward),
        match(Linear, GroupedLinear, where=local_gemm),
    )
    stage = Stage.FORWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        return quantized(cfg)

    def fused_forward(self, ops, ctxs, x, extra_inputs: Sequence[tuple[Any, ...]]):
        cast_op, linear = ops
        cast_ctx, linear_ctx = ctxs
        if cast_ctx.needs_backward:
            cast_ctx.saved = QuantizeSaved(recipe=cast_ctx.recipe)
        x2d = x.reshape(-1, linear.in_features).contiguous()
        # (The GroupedLinear's own forward, below, asserts device split sizes.)
        offsets = linear.offsets(extra_inputs[1][0], x, check=False) if isinstance(linear, GroupedLinear) else None
        qx = quantize(x2d, linear_ctx.recipe, role=TensorRole.INPUT, rowwise=True,
                      columnwise=linear_ctx.weight_requires_grad, offsets=offsets)
        y, _ = linear.op_forward(linear_ctx, qx, extra_inputs[1])
        return y.view(*x.shape[:-1], linear.out_features), [(), ()]
