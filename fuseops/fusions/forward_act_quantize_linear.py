"""Activation (plain, or gated with optional router ``probs``) + Linear (or GroupedLinear)
under a recipe, forward: the activation kernel writes its output already quantized for the
GEMM (single pass for FP8 blockwise and MXFP8; ``y`` and row amaxes, then the cast, for FP8
current scaling and NVFP4: ``fuseops.quant.emit``). The activation saves its backward state
exactly as its own forward does."""

from __future__ import annotations

from typing import Any

import torch

from fuseops.fusions._producer_quantize import CONSUMER, ProducerQuantizeLinear
from fuseops.fusions.fusion import match
from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.quantization.epilogue import Emitted
from fuseops.kernels.quantized_ops import quantized_launcher
from fuseops.ops.activation import ActivationOp, ActivationSaved
from fuseops.ops.contract import OpContext
from fuseops.ops.gated import GatedActivation, GatedSaved
from fuseops.quant.emit import EmitPlan


class ForwardActivationQuantizeLinear(ProducerQuantizeLinear):
    pattern = (match(ActivationOp, GatedActivation), CONSUMER)

    def produce(self, op, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...], plan: EmitPlan) -> Emitted:
        x2d = x.reshape(-1, x.shape[-1]).contiguous()
        if isinstance(op, GatedActivation):
            probs = extra_inputs[0] if op.scaled else None
            if ctx.needs_backward:
                ctx.saved = GatedSaved(x=x, probs=probs)
            launch = quantized_launcher(Kernel.GATED_QUANTIZE_FWD, x2d)
            return launch(x2d, op.act, probs=probs, **op.kernel_args, **plan.kernel_args)
        if ctx.needs_backward:
            ctx.saved = ActivationSaved(x=x)
        launch = quantized_launcher(Kernel.ACTIVATION_QUANTIZE_FWD, x2d)
        return launch(x2d, op.act, op.alpha, **plan.kernel_args)
