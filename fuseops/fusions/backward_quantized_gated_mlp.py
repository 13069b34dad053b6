"""The gated MoE expert MLP (GroupedLinear -> gated activation -> GroupedLinear) under a
recipe, backward: FC2's quantized dgrad applies the gate's derivative in its epilogue and
writes FC1's output gradient already quantized (``fuseops.kernels.gemm.grouped_scaled_dgrad_gated``).

Unfused, FC2's dgrad writes ``dh``, the gated backward reads it with ``z`` and writes ``dz``,
then FC1's backward quantizes ``dz`` (an amax pass and a cast for the per-tensor formats).
Here ``dh`` never reaches memory; the block formats' row-wise copy of ``dz`` comes from the
epilogue (``dz`` itself only when FC1's weight gradient needs the column-wise copy or its
bias gradient needs the sum of ``dz``), and the
per-tensor formats get ``dz`` with its per-row amaxes (no amax pass; the cast remains:
``fuseops.quant.emit``). The probabilities' gradient comes from the same tiles. FC2's weight
gradient and FC1's dgrad and wgrad then run on the quantized copies as the basic ops' would.

It reads only the basic ops' saved state (FC1's and FC2's ``QuantizedLinearSaved``, the gate's
``GatedSaved``), so it follows any forward plan. Outputs and gradients equal the unfused ops'
bit for bit on the torch reference path. ``DECLINED`` lists the gradient formats where
measurement shows the unfused kernels faster: all four, on the H100 at the Qwen3-30B-A3B shape
(``python -m benchmarks.fp8_moe --ab-fusions``): one micro-batch per step, fused / unfused
backward 20.4 / 17.4 ms (FP8 current), 30.1 / 22.0 (blockwise), 52.2 / 43.8 (MXFP8), 81.7 /
74.2 (NVFP4); eight, 19.1 / 16.1 and 29.0 / 20.9 for the FP8 formats. The epilogue's
quantized writes cost the kernel more than the separate elementwise pass and quantize cost
together. It stays registered (and tested) so a faster epilogue can be measured by emptying
``DECLINED``.
"""

from __future__ import annotations

from collections.abc import Sequence

from fuseops.fusions._producer_quantize import local_gemm
from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, measured_slower, quantized
from fuseops.fusions.grouped_mlp import one_expert_mlp
from fuseops.kernels import library
from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.quantization.formats import BLOCK_SIZE, Scaling
from fuseops.kernels.quantized_ops import quantized_launcher
from fuseops.ops import _checks
from fuseops.ops._quantized import quantize_grad, quantized_wgrad
from fuseops.ops.contract import OpContext, OpGrads
from fuseops.ops.gated import GatedActivation
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.ops.op import BasicOp
from fuseops.quant import linear_dgrad
from fuseops.quant.emit import EmitPlan, emitted_storage
from fuseops.quant.recipes import TensorRole

# Gradient formats where the unfused kernels measured faster (module docstring): all of them.
DECLINED: tuple = tuple(Scaling)


class BackwardQuantizedGatedMLP(Fusion):
    pattern = (
        match(GroupedLinear, where=local_gemm),
        match(GatedActivation),
        match(GroupedLinear, where=local_gemm),
    )
    stage = Stage.BACKWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        if reason := quantized(cfg) or one_expert_mlp(ops, extra_inputs):
            return reason
        fc1, act_op, fc2 = ops
        grad = cfg.recipe.format(TensorRole.GRAD)
        if grad.scaling in DECLINED and (reason := measured_slower(
                cfg, f"{grad.scaling.name} gradients: the unfused dgrad and gated backward measured faster")):
            return reason
        block = BLOCK_SIZE[grad.scaling] or 1
        if not act_op.interleaved and fc2.in_features % block:
            return (f"a {block}-wide gradient block would straddle z's gate and up halves "
                    f"(F = {fc2.in_features}, not interleaved)")
        return None

    def fused_backward(self, ops, ctxs: Sequence[OpContext], dy, extra_output_grads) -> list[OpGrads]:
        fc1, act_op, fc2 = ops
        fc1_ctx, act_ctx, fc2_ctx = ctxs
        s2 = fc2_ctx.saved
        dy2d = dy.reshape(-1, fc2.out_features).contiguous()
        need_dz = fc2_ctx.input_requires_grad
        qdy = quantize_grad(s2, dy2d, need_dgrad=need_dz, need_wgrad=fc2_ctx.weight_requires_grad)
        fc2_params = {}
        if fc2_ctx.weight_requires_grad:
            main_grad = _checks.main_grad(fc2.weight) if fc2.accumulate_into_main_grad else None
            fc2_params["weight"] = quantized_wgrad(s2, qdy, out_dtype=fc2.weight.dtype, main_grad=main_grad)
            if fc2.bias is not None:
                fc2_params["bias"] = library.grouped_bias_grad(dy2d, s2.offsets)
        if not need_dz:
            return [OpGrads(None), OpGrads(None), OpGrads(None, fc2_params, (None,))]

        z, probs = act_ctx.saved.x, act_ctx.saved.probs
        z2d = z.reshape(-1, z.shape[-1])
        s1 = fc1_ctx.saved
        plan = EmitPlan(s2.recipe, columnwise=fc1_ctx.weight_requires_grad, role=TensorRole.GRAD)
        emit = plan.kernel_args
        # FC1's bias gradient sums dz in high precision: then dz itself is written too.
        fc1_bias_grad = fc1.bias is not None and fc1_ctx.weight_requires_grad
        a = qdy.rowwise_operand()
        launch = quantized_launcher(Kernel.GROUPED_GEMM_SCALED_DGRAD_GATED, a.data)
        emitted, dprobs = launch(a, s2.weight.columnwise_operand(), s2.offsets, z2d, scaling=qdy.format.scaling,
                                 act=act_op.act, probs=probs, grad_scaling=emit["scaling"], element=emit["element"],
                                 store_y=emit["store_y"] or fc1_bias_grad, out_dtype=dy2d.dtype,
                                 **act_op.kernel_args)
        act_extras = (dprobs if act_ctx.extra_requires_grad[0] else None,) if act_op.scaled else ()

        dx, fc1_params = None, {}
        if fc1_ctx.input_requires_grad or fc1_ctx.weight_requires_grad:
            qdz = emitted_storage(plan, emitted, dtype=z.dtype, offsets=s1.offsets)
            if fc1_ctx.input_requires_grad:
                dx = linear_dgrad(qdz, s1.weight).view(*dy.shape[:-1], fc1.in_features)
            if fc1_ctx.weight_requires_grad:
                main_grad = _checks.main_grad(fc1.weight) if fc1.accumulate_into_main_grad else None
                fc1_params["weight"] = quantized_wgrad(s1, qdz, out_dtype=fc1.weight.dtype, main_grad=main_grad)
            if fc1_bias_grad:
                dz2d = emitted.y
                fc1_params["bias"] = library.grouped_bias_grad(dz2d, s1.offsets)
        return [
            OpGrads(dx, fc1_params, (None,)),
            OpGrads(None, {}, act_extras),
            OpGrads(None, fc2_params, (None,)),
        ]
