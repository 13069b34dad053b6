"""The quantized kernels as ``torch.library`` custom ops, so that ``torch.compile`` runs the
same Triton (sm_90: Gluon) kernels as eager instead of tracing their torch references.

``dispatch.QUANTIZED``: the amax, tensor scales and quantize cast (``quantize.py``), the scaled
GEMMs (``gemm.py``), the producers with the quantize epilogue (``producers.py``) and the MoE
MLP's fused quantized GEMMs (``grouped_mlp.py``). Traced, their references are wrong on the
H100 (the compiled FP8 MoE layer's weight gradients 103 % off under FP8 blockwise, from
inductor's code for the grouped column-wise scatter of ``reference_quantize``; a device-side
assert under FP8 current scaling) and the scaled grouped GEMMs take over a minute to compile
at 16 experts.

Callers ask ``quantized_launcher(kernel, t)`` where they asked ``dispatch.launcher``: outside a
trace it answers as that launcher (the same implementation, under torch.func transforms too;
at the same host cost, ~0.7 us, plus one Python call, ~35 ns); while
torch.compile traces, a wrapper of the launcher's signature that calls ``fuseops::<name>``.
At run time the op's implementation asks ``dispatch.launcher`` (Triton on CUDA, the reference
on CPU), and its fake implementation gives the outputs' shapes and dtypes without reading
data. The ops are functional (``custom_op.py``); ``out=`` buffers and ``main_grad`` are written
by the wrappers from the ops' fresh outputs. ``torch.library.opcheck`` checks each
(tests/quant/test_custom_ops.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fuseops.kernels.dispatch import Kernel, untraced_launcher
from fuseops.kernels.quantized_ops import gemm, grouped_mlp, producers, quantize

__all__ = ["TRACEABLE", "gemm", "grouped_mlp", "producers", "quantize", "quantized_launcher"]

# The wrapper serving each quantized kernel while torch.compile traces.
TRACEABLE: dict[Kernel, Callable[..., Any]] = {
    Kernel.AMAX: quantize.amax,
    Kernel.ROW_AMAX: quantize.row_amax,
    Kernel.TENSOR_SCALES: quantize.tensor_scales,
    Kernel.QUANTIZE: quantize.quantize,
    Kernel.GEMM_SCALED: gemm.gemm_scaled,
    Kernel.GROUPED_GEMM_SCALED: gemm.grouped_gemm_scaled,
    Kernel.GROUPED_GEMM_SCALED_WGRAD: gemm.grouped_gemm_scaled_wgrad,
    Kernel.GROUPED_GEMM_SCALED_ACT: grouped_mlp.grouped_gemm_scaled_act,
    Kernel.GROUPED_GEMM_SCALED_DGRAD_GATED: grouped_mlp.grouped_gemm_scaled_dgrad_gated,
    Kernel.ACTIVATION_QUANTIZE_FWD: producers.activation_quantize_fwd,
    Kernel.GATED_QUANTIZE_FWD: producers.gated_quantize_fwd,
    Kernel.LAYERNORM_QUANTIZE_FWD: producers.layernorm_quantize_fwd,
    Kernel.RMSNORM_QUANTIZE_FWD: producers.rmsnorm_quantize_fwd,
}


def quantized_launcher(kernel: Kernel, t: torch.Tensor) -> Callable[..., Any]:
    """What serves quantized ``kernel`` for work on ``t`` (module docstring); call it with the
    launcher's arguments."""
    if torch.compiler.is_compiling():
        return TRACEABLE[kernel]
    return untraced_launcher(kernel, t)
