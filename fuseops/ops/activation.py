"""Elementwise activations: ReLU, GELU, SiLU, SReLU (squared ReLU), Sigmoid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import Activation, AnyActivation
from fuseops.ops import _checks
from fuseops.ops.contract import OpContext, OpGrads, Saved, activation
from fuseops.ops.op import BasicOp


@dataclass(frozen=True)
class ActivationSaved(Saved):
    x: torch.Tensor | None = activation()


class ActivationOp(BasicOp):
    """``y = act(x)`` elementwise; fusions match this class and read ``act`` (a shipped
    ``Activation``, or a declaration: ``declare_activation``)."""

    act: ClassVar[AnyActivation]
    # SiLU's sigmoid slope; the other activations ignore it.
    alpha: float = 1.0

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        if ctx.needs_backward:
            ctx.saved = ActivationSaved(x=x)
        launch = launcher(Kernel.ACTIVATION_FWD, x)
        return launch(x.contiguous(), self.act, self.alpha), ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        if not ctx.input_requires_grad:
            return OpGrads(None)
        x = ctx.saved.x
        launch = launcher(Kernel.ACTIVATION_BWD, x)
        return OpGrads(launch(x.contiguous(), dy.contiguous(), self.act, self.alpha))


class ReLU(ActivationOp):
    act = Activation.RELU


class GELU(ActivationOp):
    """GELU, exact (``approximate="none"``) or with the tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = _checks.choice("approximate", approximate, ("none", "tanh"))

    @property
    def act(self) -> Activation:  # type: ignore[override]
        return Activation.GELU_TANH if self.approximate == "tanh" else Activation.GELU

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(ActivationOp):
    act = Activation.SILU


class SReLU(ActivationOp):
    """Squared ReLU: ``relu(x) ** 2``."""

    act = Activation.SRELU


class Sigmoid(ActivationOp):
    act = Activation.SIGMOID
