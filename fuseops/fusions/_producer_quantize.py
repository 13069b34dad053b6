"""The shared half of the producer -> Linear forward fusions under a recipe: the producer
(a norm or an activation) emits its output quantized (``fuseops.quant.emit``), and the Linear
or GroupedLinear runs its own quantized forward on that storage, so its saved state is the
op's own ``QuantizedLinearSaved`` (column-wise copy as an activation: offloadable)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import torch

from fuseops.fusions.fusion import Fusion, PlanConfig, Stage, match, quantized
from fuseops.kernels.quantization.epilogue import Emitted
from fuseops.ops.contract import OpContext
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.ops.linear import Linear
from fuseops.ops.op import BasicOp
from fuseops.quant.emit import EmitPlan, emitted_storage


def under_torch_autocast(cfg: PlanConfig) -> str | None:
    """Producer-emitted storages carry the producer's dtype; under ``torch.autocast`` the
    GEMM's high-precision dtype is autocast's, so the ops run on their own."""
    if cfg.autocast is not None:
        return f"torch.autocast ({cfg.autocast}) sets the GEMM dtype; the producer runs on its own"
    return None


def local_gemm(op: BasicOp) -> bool:
    """Whether ``op``'s GEMM runs on its input as given. Tensor-parallel Linears quantize their
    input after the collectives (column parallel with SP gathers it in high precision first):
    they are left to their basic op."""
    # Not ``getattr(op, "local_gemm", True)``: under torch.compile that guards on the attribute's
    # absence from a GroupedLinear, a call of ``nn.Module.__getattr__`` raising at every check.
    return op.local_gemm if isinstance(op, Linear) else True


CONSUMER = match(Linear, GroupedLinear, where=local_gemm)


class ProducerQuantizeLinear(Fusion):
    """Base of (producer, Linear | GroupedLinear) forward fusions; subclasses declare the
    pattern and ``produce``."""

    stage = Stage.FORWARD

    def guard(self, ops: Sequence[BasicOp], cfg: PlanConfig, extra_inputs) -> str | None:
        return quantized(cfg) or under_torch_autocast(cfg)

    @abc.abstractmethod
    def produce(self, op: BasicOp, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...],
                plan: EmitPlan) -> Emitted:
        """Run ``op``'s forward with the quantize epilogue (launched with
        ``plan.kernel_args``), leaving ``ctx.saved`` as ``op``'s own forward would."""

    def fused_forward(self, ops, ctxs, x, extra_inputs: Sequence[tuple[Any, ...]]):
        producer, linear = ops
        linear_ctx = ctxs[1]
        plan = EmitPlan(linear_ctx.recipe, columnwise=linear_ctx.weight_requires_grad)
        emitted = self.produce(producer, ctxs[0], x, extra_inputs[0], plan)
        # (The GroupedLinear's own forward, below, asserts device split sizes.)
        offsets = linear.offsets(extra_inputs[1][0], x, check=False) if isinstance(linear, GroupedLinear) else None
        qx = emitted_storage(plan, emitted, dtype=x.dtype, offsets=offsets)
        y, _ = linear.op_forward(linear_ctx, qx, extra_inputs[1])
        return y.view(*x.shape[:-1], linear.out_features), [(), ()]
