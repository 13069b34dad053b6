"""Activation + Linear, backward: the Linear's dgrad applies the activation's
derivative in its epilogue, ``dz = (dy @ W) * act'(z)``, so the activation's own
backward pass (a read and a write of the whole tensor) disappears."""

from __future__ import annotations

from collections.abc import Sequence

from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, unquantized
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops.activation import ActivationOp
from fuseops.ops.contract import OpContext, OpGrads
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.ops.shape import rows, unrows


class BackwardActivationLinear(Fusion):
    pattern = (match(ActivationOp), match(Linear, where=lambda op: op.local_gemm))
    stage = Stage.BACKWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        return unquantized(cfg)

    def fused_backward(self, ops, ctxs: Sequence[OpContext], dy, extra_output_grads) -> list[OpGrads]:
        act_op, linear = ops
        params = linear.param_grads(ctxs[1], dy)
        if not ctxs[0].input_requires_grad:
            return [OpGrads(None), OpGrads(None, params)]
        z = ctxs[0].saved.x
        if z.dtype != dy.dtype:
            # torch.autocast: the Linear computes in another dtype than the activation; its
            # dx is cast to the activation's dtype first, as the basic ops do.
            dz = linear.input_grad(ctxs[1], dy).to(z.dtype)
            return [act_op.op_backward(ctxs[0], dz, ()), OpGrads(None, params)]
        dy2d = rows(dy, linear.out_features).contiguous()
        z2d = rows(z, linear.in_features).contiguous()
        launch = launcher(Kernel.GEMM, dy2d)
        dz, _ = launch(dy2d, linear.compute_weight(ctxs[1]), act=act_op.act, alpha=act_op.alpha, act_grad_input=z2d)
        return [OpGrads(unrows(dz, z.shape)), OpGrads(None, params)]
