"""LayerNorm or RMSNorm + Linear (or GroupedLinear) under a recipe, forward: the norm kernel
writes its output already quantized for the GEMM (row-wise data and block scales from
registers for FP8 blockwise and MXFP8; ``y`` and row amaxes, then the cast, for FP8 current
scaling and NVFP4: ``fuseops.quant.emit``), instead of ``y`` that the GEMM's quantize pass
reads again. The norm saves its backward state exactly as its own forward does."""

from __future__ import annotations

from typing import Any

import torch

from fuseops.fusions._producer_quantize import CONSUMER, ProducerQuantizeLinear
from fuseops.fusions.fusion import match
from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.quantization.epilogue import Emitted
from fuseops.kernels.quantized_ops import quantized_launcher
from fuseops.ops.contract import OpContext
from fuseops.ops.norm import LayerNorm, NormSaved, RMSNorm
from fuseops.quant.emit import EmitPlan


class ForwardNormQuantizeLinear(ProducerQuantizeLinear):
    pattern = (match(LayerNorm, RMSNorm), CONSUMER)

    def produce(self, op, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...], plan: EmitPlan) -> Emitted:
        x2d = x.reshape(-1, op.normalized_shape).contiguous()
        mean = None
        if isinstance(op, LayerNorm):
            launch = quantized_launcher(Kernel.LAYERNORM_QUANTIZE_FWD, x2d)
            emitted, mean, rstd = launch(x2d, op.weight, op.bias, op.eps, op.zero_centered_gamma, **plan.kernel_args)
        else:
            launch = quantized_launcher(Kernel.RMSNORM_QUANTIZE_FWD, x2d)
            emitted, rstd = launch(x2d, op.weight, op.eps, op.zero_centered_gamma, **plan.kernel_args)
        if ctx.needs_backward:
            ctx.saved = NormSaved(x=x, mean=mean, rstd=rstd, weight=op.weight)
        return emitted
