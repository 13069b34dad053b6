"""The MoE expert MLP: GroupedLinear -> activation -> GroupedLinear, forward and backward.

Forward: FC1's grouped GEMM applies the activation (gated: both halves' accumulators in
one program, and the router-probability row scale) in its epilogue, then FC2. Only the
pre-activation ``z`` is saved, not the activation output ``h`` that FC2's weight gradient
needs: saved bytes stay at ``x`` and ``z`` (plain torch keeps ``z`` and ``h`` too).
Backward, gated: FC2's dgrad applies the gate's derivative in its epilogue and, from the
same tile of ``z``, writes ``h`` again and the probabilities' gradient (float32 partial
sums, no atomics), so recomputing ``h`` costs no extra pass; then FC2's wgrad with that
``h``, then FC1's dgrad and wgrad. Plain activations: FC2's dgrad applies ``act'(z)`` in
its epilogue and ``h`` is recomputed by one elementwise pass before it (also for gated
activations when FC2's input needs no gradient). When the backward frees the graph, dz is
written over z, which it no longer needs. Both GroupedLinears must get the same split sizes
(the same tensor, or equal host values), else the basic ops run. Split sizes stay on the
device: no host sync anywhere.

Under a recipe this fusion steps aside and the basic ops' quantized GEMMs run; under MXFP8
and NVFP4 ForwardQuantizedGroupedMLP (forward_quantized_grouped_mlp.py) runs the forward, FC1's
quantized GEMM applying the activation and writing FC2's quantized input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, same_extra_input, unquantized
from fuseops.kernels import library
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops import _autocast
from fuseops.ops.activation import ActivationOp, ActivationSaved
from fuseops.ops.contract import OpContext, OpGrads
from fuseops.ops.executor.save_notice import notice_early
from fuseops.ops.executor.saved_state import graph_freed_after_backward
from fuseops.ops.gated import GatedActivation, GatedSaved
from fuseops.ops.grouped_linear import GroupedLinear, GroupedLinearSaved
from fuseops.ops.op import BasicOp
from fuseops.ops.shape import rows, unrows


def _activation(act_op: BasicOp, z: torch.Tensor, probs: torch.Tensor | None) -> torch.Tensor:
    """``h = act(z)`` (times ``probs`` per row when scaled) for 2-D ``z``."""
    if isinstance(act_op, GatedActivation):
        launch = launcher(Kernel.GATED_FWD, z)
        return launch(z, act_op.act, probs=probs, **act_op.kernel_args)
    launch = launcher(Kernel.ACTIVATION_FWD, z)
    return launch(z, act_op.act, act_op.alpha)


def one_expert_mlp(ops: Sequence[BasicOp], extra_inputs) -> str | None:
    """Why FC1 -> activation -> FC2 do not form one expert MLP (None when they do): both
    GroupedLinears must have the same groups and rows."""
    if ops[0].num_groups != ops[2].num_groups:
        return "the two GroupedLinears have different group counts"
    if not same_extra_input(extra_inputs[0][0], extra_inputs[2][0]):
        return "the two GroupedLinears get different split sizes"
    return None


class GroupedMLP(Fusion):
    pattern = (match(GroupedLinear), match(ActivationOp, GatedActivation), match(GroupedLinear))
    stage = Stage.BOTH

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        return unquantized(cfg) or one_expert_mlp(ops, extra_inputs)

    def fused_forward(self, ops, ctxs: Sequence[OpContext], x, extra_inputs: Sequence[tuple[Any, ...]]):
        fc1, act_op, fc2 = ops
        probs = extra_inputs[1][0] if getattr(act_op, "scaled", False) else None
        offsets = fc1.offsets(extra_inputs[0][0], x)
        # Under torch.autocast both GEMMs run in its dtype (weights cast once per version).
        x = _autocast.cast_input(ctxs[0].autocast, x)
        w1, b1 = fc1.compute_weight(ctxs[0]), fc1.compute_bias(ctxs[0])
        w2, b2 = fc2.compute_weight(ctxs[2]), fc2.compute_bias(ctxs[2])
        x2d = rows(x, fc1.in_features).contiguous()
        gemm = library.grouped_gemm
        # z also feeds the recompute of h for FC2's weight gradient.
        keep_z = ctxs[1].needs_backward or ctxs[2].weight_requires_grad
        # Saved as they are made, each noticed before the GEMM after it: an offload copy
        # of x may run beside both GEMMs, and one of z beside FC2 (save_notice.py).
        fc1.save(ctxs[0], x, offsets)
        notice_early(ctxs[:1])
        if isinstance(act_op, GatedActivation):
            h, z = library.grouped_gemm_gated(x2d, w1.transpose(1, 2), offsets, bias=b1, act=act_op.act,
                          probs=probs, save_preact=keep_z, **act_op.kernel_args)
        else:
            h, z = gemm(x2d, w1.transpose(1, 2), offsets, bias=b1, act=act_op.act,
                        alpha=act_op.alpha, save_preact=keep_z)
        if keep_z:
            record = GatedSaved(x=z, probs=probs) if isinstance(act_op, GatedActivation) else ActivationSaved(x=z)
            ctxs[1].saved = record
            notice_early(ctxs[1:2])
        y, _ = gemm(h, w2.transpose(1, 2), offsets, bias=b2)

        if ctxs[2].needs_backward:
            # h is recomputed from z in backward (module docstring).
            ctxs[2].saved = GroupedLinearSaved(
                weight=w2 if ctxs[2].input_requires_grad else None, offsets=offsets
            )
        return unrows(y, x.shape[:-1] + (fc2.out_features,)), [(), (), ()]

    def fused_backward(self, ops, ctxs: Sequence[OpContext], dy, extra_output_grads) -> list[OpGrads]:
        fc1, act_op, fc2 = ops
        fc1_ctx, act_ctx, fc2_ctx = ctxs
        offsets = fc2_ctx.saved.offsets
        dy2d = rows(dy, fc2.out_features).contiguous()
        z, probs = act_ctx.saved.x, getattr(act_ctx.saved, "probs", None)

        # When this backward frees the graph, z is dead once FC2's dgrad has read it: dz
        # (z's shape) is written over it, tile by tile, each tile read before it is written.
        # That saves a z-sized buffer at FC1's weight gradient, the peak.
        dz_out = z if graph_freed_after_backward() else None
        h = dz = dprobs = None
        if fc2_ctx.weight_requires_grad and not isinstance(act_op, GatedActivation):
            h = _activation(act_op, z, probs)
        if fc2_ctx.input_requires_grad:
            if isinstance(act_op, GatedActivation):
                dz, dprobs, h = library.grouped_gemm_dgrad_gated(dy2d, fc2_ctx.saved.weight, offsets, z, act=act_op.act,
                                       probs=probs, want_h=fc2_ctx.weight_requires_grad,
                                       out=dz_out, **act_op.kernel_args)
            else:
                dz = fc2.input_grad(fc2_ctx, dy2d, act=act_op.act, alpha=act_op.alpha,
                                    act_grad_input=z, out=dz_out)
        fc2_params = {}
        if fc2_ctx.weight_requires_grad:
            if h is None:
                h = _activation(act_op, z, probs)
            fc2_params = fc2.param_grads(fc2_ctx, dy2d, h)
        # FC1's backward, where FC1's weight gradient makes the peak, needs only dz.
        h = None
        if dz is None:
            return [OpGrads(None), OpGrads(None), OpGrads(None, fc2_params, (None,))]

        dx = fc1.input_grad(fc1_ctx, dz)
        if dx is not None:
            dx = unrows(dx, dy.shape[:-1] + (fc1.in_features,))
        act_extras = (dprobs if act_ctx.extra_requires_grad[0] else None,) if getattr(act_op, "scaled", False) else ()
        return [
            OpGrads(dx, fc1.param_grads(fc1_ctx, dz), (None,)),
            OpGrads(None, {}, act_extras),
            OpGrads(None, fc2_params, (None,)),
        ]
