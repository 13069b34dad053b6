"""Linear + AddExtraInput, forward: the residual add happens in the GEMM epilogue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, unquantized
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops import _autocast
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.ops.residual import AddExtraInput, NothingSaved
from fuseops.ops.shape import rows, unrows


class ForwardLinearAddExtraInput(Fusion):
    pattern = (match(Linear, where=lambda op: op.local_gemm), match(AddExtraInput))
    stage = Stage.FORWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        if reason := unquantized(cfg):
            return reason
        (residual,) = extra_inputs[1]
        if cfg.autocast is not None and isinstance(residual, torch.Tensor) and residual.dtype != cfg.autocast:
            # x + r promotes: the epilogue writes the GEMM's dtype only.
            return f"torch.autocast: the residual ({residual.dtype}) is not in the GEMM's dtype ({cfg.autocast})"
        return None

    def fused_forward(self, ops, ctxs, x, extra_inputs: Sequence[tuple[Any, ...]]):
        linear, _ = ops
        (residual,) = extra_inputs[1]
        x = _autocast.cast_input(ctxs[0].autocast, x)
        weight = linear.compute_weight(ctxs[0])
        linear.save(ctxs[0], x, weight)
        if ctxs[1].needs_backward:
            ctxs[1].saved = NothingSaved()
        x2d = rows(x, linear.in_features).contiguous()
        r2d = rows(residual, linear.out_features).contiguous()
        launch = launcher(Kernel.GEMM, x2d)
        y, _ = launch(x2d, weight.t(), bias=linear.compute_bias(ctxs[0]), residual=r2d)
        return unrows(y, x.shape[:-1] + (linear.out_features,)), [(), ()]
