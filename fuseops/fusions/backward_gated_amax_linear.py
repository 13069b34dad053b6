"""Linear or GroupedLinear -> gated activation under a per-tensor gradient format (FP8 current
scaling, NVFP4), backward: the gated backward emits its output gradient ``dz`` with each row's amax,
so FC1's quantize of ``dz`` reads the tensor amax from them instead of an amax pass over ``dz``.

Unfused, the gate writes ``dz`` and FC1's backward reads it twice: the amax pass, then the
cast. Here the gate's elementwise kernel maxes ``|dz|`` per row as it stores it (no GEMM
epilogue: FC2's dgrad is untouched, unlike ``BackwardQuantizedGatedMLP``), and
``fuseops.quant.emit`` turns the row amaxes into the group amaxes and runs the cast. At the
Qwen3-30B-A3B shape (E=128, T=32768, top-8, F=768) that is one read of ``dz`` [262144, 1536]
bf16, 0.8 GB, less per step. The block formats have no amax pass: the fusion steps aside.

It reads only the basic ops' saved state (FC1's ``QuantizedLinearSaved``, the gate's
``GatedSaved``), so it follows any forward plan; outputs and every gradient equal the unfused
ops' bit for bit (the group amax of the row amaxes is the amax of ``dz``, a maximum in any
order), through the Triton kernels and the torch references alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fuseops.fusions._producer_quantize import local_gemm, under_torch_autocast
from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, quantized
from fuseops.kernels import library
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.quantization.epilogue import Emitted
from fuseops.kernels.quantization.formats import Scaling
from fuseops.ops import _checks
from fuseops.ops._quantized import quantized_wgrad
from fuseops.ops.contract import OpContext, OpGrads
from fuseops.ops.gated import GatedActivation
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.quant import linear_dgrad
from fuseops.quant.emit import EmitPlan, emitted_storage
from fuseops.quant.recipes import TensorRole

# Gradient formats whose quantize starts with a tensor amax pass (the one this removes).
_PER_TENSOR = (Scaling.TENSOR, Scaling.NVFP4)


class BackwardGatedAmaxLinear(Fusion):
    pattern = (match(GroupedLinear, Linear, where=local_gemm), match(GatedActivation))
    stage = Stage.BACKWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        if reason := quantized(cfg) or under_torch_autocast(cfg):
            return reason
        grad = cfg.recipe.format(TensorRole.GRAD)
        if grad.scaling not in _PER_TENSOR:
            return f"{grad.scaling.name} gradients have no amax pass to save"
        return None

    def fused_backward(self, ops, ctxs: Sequence[OpContext], dy, extra_output_grads) -> list[OpGrads]:
        fc1, act_op = ops
        fc1_ctx, act_ctx = ctxs
        if not (act_ctx.input_requires_grad and fc1_ctx.input_requires_grad):
            # FC1 quantizes dz column-wise only, or needs nothing: the basic ops, as they are.
            act_grads = act_op.op_backward(act_ctx, dy, extra_output_grads)
            fc1_grads = fc1.op_backward(fc1_ctx, act_grads.dx, ()) if act_grads.dx is not None else OpGrads(None)
            return [fc1_grads, OpGrads(None, act_grads.params, act_grads.extra_inputs)]
        saved, s1 = act_ctx.saved, fc1_ctx.saved
        z2d = saved.x.reshape(-1, saved.x.shape[-1]).contiguous()
        dy2d = dy.reshape(-1, dy.shape[-1]).contiguous()
        row_amax = torch.zeros(z2d.shape[0], dtype=torch.float32, device=z2d.device)
        launch = launcher(Kernel.GATED_BWD, z2d)
        dz2d, dprobs = launch(z2d, dy2d, act_op.act, probs=saved.probs, row_amax=row_amax, **act_op.kernel_args)
        act_extras = (dprobs if act_ctx.extra_requires_grad[0] else None,) if act_op.scaled else ()

        # What FC1's own backward quantizes (row-wise for dgrad, column-wise for wgrad), from
        # the emitted row amaxes.
        plan = EmitPlan(s1.recipe, columnwise=fc1_ctx.weight_requires_grad, role=TensorRole.GRAD)
        qdz = emitted_storage(plan, Emitted(dz2d, None, None, row_amax), dtype=dz2d.dtype, offsets=s1.offsets)
        if isinstance(fc1, Linear):
            dz = dz2d.view(saved.x.shape)
            return [OpGrads(fc1.input_grad(fc1_ctx, dz, qdz), fc1.param_grads(fc1_ctx, dz, qdy=qdz)),
                    OpGrads(None, {}, act_extras)]
        dx = linear_dgrad(qdz, s1.weight).view(*saved.x.shape[:-1], fc1.in_features)
        params: dict[str, torch.Tensor | None] = {}
        if fc1_ctx.weight_requires_grad:
            main_grad = _checks.main_grad(fc1.weight) if fc1.accumulate_into_main_grad else None
            params["weight"] = quantized_wgrad(s1, qdz, out_dtype=fc1.weight.dtype, main_grad=main_grad)
            if fc1.bias is not None:
                params["bias"] = library.grouped_bias_grad(dz2d, s1.offsets)
        return [OpGrads(dx, params, (None,)), OpGrads(None, {}, act_extras)]
