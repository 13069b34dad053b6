"""MakeExtraOutput + Linear, backward: the Linear's dgrad accumulates into the branch
gradient in its epilogue (``dx = dy @ W + d_branch``) instead of a separate add."""

from __future__ import annotations

from collections.abc import Sequence

from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, unquantized
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops.contract import OpContext, OpGrads
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.ops.residual import MakeExtraOutput


class BackwardExtraOutputLinear(Fusion):
    pattern = (match(MakeExtraOutput), match(Linear, where=lambda op: op.local_gemm))
    stage = Stage.BACKWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        return unquantized(cfg)

    def fused_backward(self, ops, ctxs: Sequence[OpContext], dy, extra_output_grads) -> list[OpGrads]:
        _, linear = ops
        (dbranch,), _ = extra_output_grads
        params = linear.param_grads(ctxs[1], dy)
        if not ctxs[0].input_requires_grad:
            return [OpGrads(None), OpGrads(None, params)]
        if dbranch is not None and dbranch.dtype != dy.dtype:
            # torch.autocast: the branch is in another dtype than the GEMM; sum as the
            # basic ops do, after casting dx to it.
            return [OpGrads(linear.input_grad(ctxs[1], dy).to(dbranch.dtype) + dbranch), OpGrads(None, params)]
        dy2d = dy.reshape(-1, linear.out_features).contiguous()
        r2d = None if dbranch is None else dbranch.reshape(-1, linear.in_features).contiguous()
        launch = launcher(Kernel.GEMM, dy2d)
        dx, _ = launch(dy2d, linear.compute_weight(ctxs[1]), residual=r2d)
        dx = dx.view(*dy.shape[:-1], linear.in_features)
        return [OpGrads(dx), OpGrads(None, params)]
