"""Linear (with its bias, or followed by Bias) + activation, forward: one GEMM whose
epilogue adds the bias and applies the activation (plain or gated). The
pre-activation is written beside the output only when backward needs it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, unquantized
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops import _autocast
from fuseops.ops.activation import ActivationOp, ActivationSaved
from fuseops.ops.bias import Bias, BiasSaved
from fuseops.ops.contract import OpContext
from fuseops.ops.gated import GatedActivation, GatedSaved
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.ops.shape import rows, unrows


def _linear_act_forward(
    linear: Linear, bias: torch.Tensor | None, act_op: BasicOp, ctxs: Sequence[OpContext], x: torch.Tensor
) -> torch.Tensor:
    """Run the GEMM with epilogue; fill the Linear's and the activation's saved state."""
    linear_ctx, act_ctx = ctxs[0], ctxs[-1]
    x = _autocast.cast_input(linear_ctx.autocast, x)
    weight = linear.compute_weight(linear_ctx)
    linear.save(linear_ctx, x, weight)
    x2d = rows(x, linear.in_features).contiguous()
    save_preact = act_ctx.needs_backward
    if isinstance(act_op, GatedActivation):
        launch = launcher(Kernel.GEMM_GATED, x2d)
        y, z = launch(x2d, weight.t(), bias=bias, act=act_op.act, save_preact=save_preact, **act_op.kernel_args)
    else:
        launch = launcher(Kernel.GEMM, x2d)
        y, z = launch(x2d, weight.t(), bias=bias, act=act_op.act, alpha=act_op.alpha, save_preact=save_preact)
    lead = x.shape[:-1]
    if save_preact:
        z = unrows(z, lead + (z.shape[-1],))
        act_ctx.saved = GatedSaved(x=z) if isinstance(act_op, GatedActivation) else ActivationSaved(x=z)
    return unrows(y, lead + (y.shape[-1],))


def _no_scaled_probs(op: BasicOp) -> bool:
    # Not ``getattr(op, "scaled", False)``: under torch.compile that guards on the attribute's
    # absence, a call of ``nn.Module.__getattr__`` raising on every guard check (~1 us each).
    return not (isinstance(op, GatedActivation) and op.scaled)


class ForwardLinearBiasActivation(Fusion):
    """Linear (its own bias, if any) -> activation."""

    pattern = (match(Linear, where=lambda op: op.local_gemm), match(ActivationOp, GatedActivation, where=_no_scaled_probs))
    stage = Stage.FORWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        return unquantized(cfg)

    def fused_forward(self, ops, ctxs, x, extra_inputs: Sequence[tuple[Any, ...]]):
        linear, act_op = ops
        y = _linear_act_forward(linear, linear.compute_bias(ctxs[0]), act_op, ctxs, x)
        return y, [(), ()]


class ForwardLinearSeparateBiasActivation(ForwardLinearBiasActivation):
    """Linear without bias -> Bias -> activation."""

    pattern = (
        match(Linear, where=lambda op: op.local_gemm and op.bias is None),
        match(Bias),
        match(ActivationOp, GatedActivation, where=_no_scaled_probs),
    )

    def fused_forward(self, ops, ctxs, x, extra_inputs: Sequence[tuple[Any, ...]]):
        linear, bias_op, act_op = ops
        if ctxs[1].needs_backward:
            ctxs[1].saved = BiasSaved()
        # The bias in the GEMM's compute dtype (the Bias op casts the same way).
        bias = bias_op.compute_bias(ctxs[1], _autocast.cast_input(ctxs[0].autocast, x).dtype)
        y = _linear_act_forward(linear, bias, act_op, ctxs, x)
        return y, [(), (), ()]
