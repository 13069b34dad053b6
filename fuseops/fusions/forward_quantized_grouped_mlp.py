"""The MoE expert MLP (GroupedLinear -> activation -> GroupedLinear) under a recipe, forward.

FC1's quantized grouped GEMM applies the activation (plain or gated, interleaved, clamped,
with the router probabilities' row scale) in its epilogue and writes FC2's input already
quantized (``fuseops.kernels.gemm.grouped_scaled_act``): the row-wise copy for FP8 blockwise
and MXFP8; ``h`` and per-row amaxes, then the cast, for FP8 current scaling and NVFP4
(``fuseops.quant.emit``). It stores the pre-activation ``z`` only when the activation's
backward needs it; neither ``z`` nor ``h`` in high precision is read again. FC2 runs its own
quantized forward on that storage.

Every op's saved state is what its own quantized forward saves (FC1's and FC2's
``QuantizedLinearSaved``, the activation's ``z``), so the basic ops' backward follows.

It applies under MXFP8 and NVFP4, whose FC1 dequantizes tiles in the main loop: there it runs
the layer's forward 6-13 % faster than the unfused FC1 + activation-quantize kernels (H100,
Qwen3-30B-A3B and Mixtral expert shapes, ``python -m benchmarks.fp8_moe --ab-fusions``). Under
FP8 current scaling and blockwise FC1 runs on float8 tensor cores at 1.1-1.4 PFLOP/s, and the
same comparison measures the fused forward 3-6 % slower (its epilogue, which writes z and h,
does not overlap the main loop), so it declines and the unfused ops run (the formats are
``grouped_scaled_act.UNFUSED_FASTER``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fuseops.fusions._producer_quantize import local_gemm, under_torch_autocast
from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, measured_slower, quantized
from fuseops.fusions.grouped_mlp import one_expert_mlp
from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.gemm import grouped_scaled_act
from fuseops.kernels.quantized_ops import quantized_launcher
from fuseops.ops._quantized import quantized_operands
from fuseops.ops.activation import ActivationOp, ActivationSaved
from fuseops.ops.contract import OpContext
from fuseops.ops.gated import GatedActivation, GatedSaved
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.ops.op import BasicOp
from fuseops.quant.emit import EmitPlan, emitted_storage
from fuseops.quant.recipes import TensorRole


class ForwardQuantizedGroupedMLP(Fusion):
    pattern = (
        match(GroupedLinear, where=local_gemm),
        match(ActivationOp, GatedActivation),
        match(GroupedLinear, where=local_gemm),
    )
    stage = Stage.FORWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        if reason := quantized(cfg) or under_torch_autocast(cfg) or one_expert_mlp(ops, extra_inputs):
            return reason
        if cfg.recipe.format(TensorRole.INPUT).scaling in grouped_scaled_act.UNFUSED_FASTER:
            return measured_slower(cfg, "FP8 on tensor cores: the unfused FC1 and activation kernels measured faster")
        return None

    def fused_forward(self, ops, ctxs: Sequence[OpContext], x, extra_inputs: Sequence[tuple[Any, ...]]):
        fc1, act_op, fc2 = ops
        fc1_ctx, act_ctx, fc2_ctx = ctxs
        offsets = fc1.offsets(extra_inputs[0][0], x)
        x2d = x.reshape(-1, fc1.in_features).contiguous()
        qx, qw, fc1_saved = quantized_operands(
            fc1_ctx.recipe, x2d, fc1.weight, offsets=offsets,
            need_dgrad=fc1_ctx.input_requires_grad, need_wgrad=fc1_ctx.weight_requires_grad,
        )
        if fc1_ctx.needs_backward:
            fc1_ctx.saved = fc1_saved

        plan = EmitPlan(fc2_ctx.recipe, columnwise=fc2_ctx.weight_requires_grad)
        is_gated = isinstance(act_op, GatedActivation)
        probs = extra_inputs[1][0] if is_gated and act_op.scaled else None
        gate = dict(gated=True, probs=probs, **act_op.kernel_args) if is_gated else dict(alpha=act_op.alpha)
        a = qx.rowwise_operand()
        launch = quantized_launcher(Kernel.GROUPED_GEMM_SCALED_ACT, a.data)
        emitted, z = launch(a, qw.rowwise_operand(), offsets, act=act_op.act, bias=fc1.bias,
                            save_preact=act_ctx.needs_backward, out_dtype=fc1.weight.dtype,
                            **gate, **plan.kernel_args)
        if act_ctx.needs_backward:
            # The activation saves its input as FC1 returns it: x's leading dims.
            z = z.view(*x.shape[:-1], z.shape[-1])
            act_ctx.saved = GatedSaved(x=z, probs=probs) if is_gated else ActivationSaved(x=z)

        qh = emitted_storage(plan, emitted, dtype=fc1.weight.dtype, offsets=offsets)
        y, _ = fc2.op_forward(fc2_ctx, qh, extra_inputs[2])
        return y.view(*x.shape[:-1], fc2.out_features), [(), (), ()]
