"""Linear + AddExtraInput, forward: the residual add happens in the GEMM epilogue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, unquantized
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.ops.residual import AddExtraInput, NothingSaved


class ForwardLinearAddExtraInput(Fusion):
    pattern = (match(Linear, where=lambda op: op.local_gemm), match(AddExtraInput))
    stage = Stage.FORWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        return unquantized(cfg)

    def fused_forward(self, ops, ctxs, x, extra_inputs: Sequence[tuple[Any, ...]]):
        linear, _ = ops
        (residual,) = extra_inputs[1]
        linear.save(ctxs[0], x)
        if ctxs[1].needs_backward:
            ctxs[1].saved = NothingSaved()
        x2d = x.reshape(-1, linear.in_features).contiguous()
        r2d = residual.reshape(-1, linear.out_features).contiguous()
        launch = launcher(Kernel.GEMM, x2d)
        y, _ = launch(x2d, linear.weight.t(), bias=linear.bias, residual=r2d)
        return y.view(*x.shape[:-1], linear.out_features), [(), ()]
