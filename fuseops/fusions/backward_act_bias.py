"""Activation backward + bias grad: one pass computes ``dz = dy * act'(z)`` and the
bias gradient ``sum(dz)`` over rows, for a bias owned by the preceding Linear or Bias."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, unquantized
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops.activation import ActivationOp
from fuseops.ops.bias import Bias
from fuseops.ops.contract import OpContext, OpGrads
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.ops.shape import rows, unrows


def _act_backward_dbias(act_op: ActivationOp, ctx: OpContext, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = ctx.saved.x
    n = z.shape[-1]
    z2d, dy2d = rows(z, n).contiguous(), rows(dy, n).contiguous()
    launch = launcher(Kernel.ACTIVATION_BWD_DBIAS, z2d)
    dz, dbias = launch(z2d, dy2d, act_op.act, act_op.alpha)
    return unrows(dz, z.shape), dbias


def _bias_needs_grad(ops: Sequence[BasicOp], cfg: PlanConfig) -> str | None:
    if not ops[0].bias.requires_grad:
        return "the bias needs no gradient"
    return None


class BackwardBiasActivation(Fusion):
    """Bias -> activation: the activation's backward also reduces the bias gradient."""

    pattern = (match(Bias), match(ActivationOp))
    stage = Stage.BACKWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        return _bias_needs_grad(ops, cfg)

    def fused_backward(self, ops, ctxs: Sequence[OpContext], dy, extra_output_grads) -> list[OpGrads]:
        bias_op, act_op = ops
        dz, dbias = _act_backward_dbias(act_op, ctxs[1], dy)
        return [OpGrads(dz, {"bias": dbias}), OpGrads(None)]


class BackwardLinearBiasActivation(Fusion):
    """Linear with bias -> activation: the bias gradient comes out of the activation's
    backward pass, and the Linear's dgrad/wgrad consume its ``dz``."""

    pattern = (match(Linear, where=lambda op: op.local_gemm and op.bias is not None), match(ActivationOp))
    stage = Stage.BACKWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        if reason := unquantized(cfg):
            return reason
        return _bias_needs_grad(ops, cfg)

    def fused_backward(self, ops, ctxs: Sequence[OpContext], dy, extra_output_grads) -> list[OpGrads]:
        linear, act_op = ops
        dz, dbias = _act_backward_dbias(act_op, ctxs[1], dy)
        grads = OpGrads(linear.input_grad(ctxs[0], dz), linear.param_grads(ctxs[0], dz, dbias))
        return [grads, OpGrads(None)]
