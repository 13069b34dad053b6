"""Gated activations: ``a, b = x.chunk(2, -1)`` (or interleaved), ``y = act(a) * b``.

SwiGLU, GeGLU, ReGLU, SReGLU and gpt-oss's ClampedSwiGLU. With ``scaled=True`` the op
takes one extra input ``probs`` (one value per row, e.g. MoE router weights) and
returns ``y * probs[:, None]``, with the gradient for ``probs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import Activation, AnyActivation
from fuseops.ops import _checks
from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec, activation
from fuseops.ops.op import BasicOp
from fuseops.ops.shape import rows, unrows


@dataclass(frozen=True)
class GatedSaved(Saved):
    x: torch.Tensor | None = activation()
    probs: torch.Tensor | None = activation()


class GatedActivation(BasicOp):
    """Base of the gated activations; fusions match this class and read its fields (``act``: a
    shipped ``Activation``, or a declaration: ``declare_activation``)."""

    act: ClassVar[AnyActivation]
    clamped: ClassVar[bool] = False
    limit: float = 7.0
    alpha: float = 1.0

    def __init__(self, *, interleaved: bool = False, scaled: bool = False) -> None:
        super().__init__()
        self.interleaved = interleaved
        self.scaled = scaled

    def __setattr__(self, name: str, value: Any) -> None:
        # Checked when set after construction too: a fused kernel reads them as constants.
        if name in ("interleaved", "scaled"):
            value = _checks.flag(name, value)
        super().__setattr__(name, value)

    @property
    def num_extra_inputs(self) -> int:  # type: ignore[override]
        """1 with ``scaled`` (the probs), read from ``scaled`` at each call: a flag set after
        construction changes what the op takes, as the settings it is part of do."""
        return 1 if self.scaled else 0

    def extra_repr(self) -> str:
        return f"interleaved={self.interleaved}, scaled={self.scaled}"

    @property
    def kernel_args(self) -> dict[str, Any]:
        """Keyword arguments every gated kernel (and GEMM epilogue) takes."""
        return dict(interleaved=self.interleaved, clamped=self.clamped, limit=self.limit, alpha=self.alpha)

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        if len(x.shape) == 0 or x.shape[-1] % 2:
            raise ValueError(f"{type(self).__name__} input: expected shape [..., 2 * F] (an even last dim), got {_checks.shown(x.shape)}")
        if self.scaled:
            rows = math.prod(x.shape[:-1])
            _checks.extra_tensor(type(self).__name__, "probs", extra_inputs[0], x, (rows,), dtypes=(x.dtype, torch.float32))
        return x.with_shape(x.shape[:-1] + (x.shape[-1] // 2,))

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        probs = extra_inputs[0] if self.scaled else None
        if ctx.needs_backward:
            ctx.saved = GatedSaved(x=x, probs=probs)
        x2d = rows(x, x.shape[-1]).contiguous()
        launch = launcher(Kernel.GATED_FWD, x2d)
        y = launch(x2d, self.act, probs=probs, **self.kernel_args)
        return unrows(y, x.shape[:-1] + (x.shape[-1] // 2,)), ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        saved: GatedSaved = ctx.saved
        x2d = rows(saved.x, saved.x.shape[-1]).contiguous()
        # Explicit width: a [0, F] gradient cannot infer a -1 dim.
        dy2d = dy.reshape(x2d.shape[0], x2d.shape[1] // 2).contiguous()
        launch = launcher(Kernel.GATED_BWD, x2d)
        dx, dprobs = launch(x2d, dy2d, self.act, probs=saved.probs, **self.kernel_args)
        extras = (dprobs if ctx.extra_requires_grad[0] else None,) if self.scaled else ()
        return OpGrads(unrows(dx, saved.x.shape) if ctx.input_requires_grad else None, {}, extras)


class SwiGLU(GatedActivation):
    """``silu(a) * b``."""

    act = Activation.SILU


class GeGLU(GatedActivation):
    """``gelu(a) * b`` (tanh approximation by default)."""

    def __init__(self, approximate: str = "tanh", *, interleaved: bool = False, scaled: bool = False) -> None:
        super().__init__(interleaved=interleaved, scaled=scaled)
        self.approximate = _checks.choice("approximate", approximate, ("none", "tanh"))

    @property
    def act(self) -> Activation:  # type: ignore[override]
        return Activation.GELU_TANH if self.approximate == "tanh" else Activation.GELU


class ReGLU(GatedActivation):
    """``relu(a) * b``."""

    act = Activation.RELU


class SReGLU(GatedActivation):
    """``relu(a) ** 2 * b``."""

    act = Activation.SRELU


class ClampedSwiGLU(GatedActivation):
    """gpt-oss: ``a = a.clamp(max=limit)``, ``b = b.clamp(-limit, limit)``,
    ``y = a * sigmoid(alpha * a) * (b + 1)``."""

    act = Activation.SILU
    clamped = True

    def __init__(self, limit: float = 7.0, alpha: float = 1.702, *, interleaved: bool = False, scaled: bool = False) -> None:
        super().__init__(interleaved=interleaved, scaled=scaled)
        if isinstance(limit, bool) or not isinstance(limit, (int, float)):
            raise TypeError(f"limit: expected a positive float, got {limit!r}")
        if not (limit > 0):
            raise ValueError(f"limit: expected a positive float, got {limit!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise TypeError(f"alpha: expected a finite float, got {alpha!r}")
        # A NaN or infinite slope makes every output NaN.
        if not math.isfinite(alpha):
            raise ValueError(f"alpha: expected a finite float, got {alpha!r}")
        self.limit, self.alpha = float(limit), float(alpha)

    def extra_repr(self) -> str:
        return f"limit={self.limit}, alpha={self.alpha}, " + super().extra_repr()
