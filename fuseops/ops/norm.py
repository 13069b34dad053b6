"""LayerNorm and RMSNorm over the last dim, optionally with zero-centred gamma
(the scale is ``1 + weight``, so weight decay pulls it towards identity)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops import _autocast, _checks
from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec, activation, parameter
from fuseops.ops.op import BasicOp
from fuseops.ops.shape import rows, unrows


@dataclass(frozen=True)
class NormSaved(Saved):
    x: torch.Tensor | None = activation()
    # Float32 statistics per row: LayerNorm keeps mean and rstd, RMSNorm rstd only.
    mean: torch.Tensor | None = activation()
    rstd: torch.Tensor | None = activation()
    weight: torch.Tensor | None = parameter()


class _Norm(BasicOp):
    has_bias: bool

    def __init__(
        self,
        normalized_shape: int,
        eps: float = 1e-5,
        zero_centered_gamma: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalized_shape = _checks.positive_int("normalized_shape", normalized_shape)
        if not (isinstance(eps, (int, float)) and eps > 0):
            raise ValueError(f"eps: expected a positive float, got {eps!r}")
        _checks.float_dtype("dtype", dtype)
        self.eps = float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(normalized_shape, **factory))
        self.bias = torch.nn.Parameter(torch.empty(normalized_shape, **factory)) if self.has_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The initial values (gamma ones, or zeros when zero-centered; beta zeros), as
        torch.nn's norms: what a model built on the meta device and moved with ``to_empty``
        calls per module (FSDP2, torchtitan), whose parameters are otherwise uninitialized."""
        (torch.nn.init.zeros_ if self.zero_centered_gamma else torch.nn.init.ones_)(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        _checks.features(self, x, self.normalized_shape)
        _checks.matches_parameters(self, x)
        return x.with_dtype(self._output_dtype(x.autocast, x.dtype, x.device.type))

    def _output_dtype(self, autocast: torch.dtype | None, x_dtype: torch.dtype, device_type: str) -> torch.dtype:
        # The class name only under autocast: read in a torch.compile trace, it costs guards.
        if autocast is None:
            return x_dtype
        return _autocast.norm_output_dtype(autocast, x_dtype, device_type, type(self).__name__)

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return rows(t, self.normalized_shape).contiguous()

    def _mixed(self, ctx: OpContext, x: torch.Tensor) -> bool:
        """Under ``torch.autocast`` with an input of another dtype than the parameters: the
        norm then runs in float32 (module docstring of ``_autocast``)."""
        return ctx.autocast is not None and x.dtype != self.weight.dtype

    def _compute_rows(self, ctx: OpContext, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x.float() if self._mixed(ctx, x) else x)

    def _output(self, ctx: OpContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y = unrows(y, x.shape)
        if self._mixed(ctx, x):
            y = y.to(self._output_dtype(ctx.autocast, x.dtype, x.device.type))
        return y

    def _backward_rows(self, s: NormSaved, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``dy`` and ``x`` as rows in the dtype forward computed in (float32 when mixed)."""
        x2d = self._rows(s.x)
        if x2d.dtype != self.weight.dtype:
            x2d, dy = x2d.float(), dy.float()
        return self._rows(dy), x2d


class LayerNorm(_Norm):
    """``(x - mean) / sqrt(var + eps) * gamma + bias`` over the last dim.

    Args:
        normalized_shape: size of the last dim.
        eps: added to the variance.
        zero_centered_gamma: the scale is ``1 + weight`` (weight starts at zero).
    """

    has_bias = True

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        x2d = self._compute_rows(ctx, x)
        launch = launcher(Kernel.LAYERNORM_FWD, x2d)
        y, mean, rstd = launch(x2d, self.weight, self.bias, self.eps, self.zero_centered_gamma)
        if ctx.needs_backward:
            ctx.saved = NormSaved(x=x, mean=mean, rstd=rstd, weight=self.weight)
        return self._output(ctx, x, y), ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        s: NormSaved = ctx.saved
        dy2d, x2d = self._backward_rows(s, dy)
        launch = launcher(Kernel.LAYERNORM_BWD, x2d)
        dx, dw, db = launch(dy2d, x2d, s.weight, s.mean, s.rstd, self.zero_centered_gamma)
        params = {"weight": dw, "bias": db} if ctx.weight_requires_grad else {}
        return OpGrads(unrows(dx, s.x.shape) if ctx.input_requires_grad else None, params)


class RMSNorm(_Norm):
    """``x / sqrt(mean(x^2) + eps) * gamma`` over the last dim.

    Args:
        normalized_shape: size of the last dim.
        eps: added to the mean square.
        zero_centered_gamma: the scale is ``1 + weight`` (weight starts at zero).
    """

    has_bias = False

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        x2d = self._compute_rows(ctx, x)
        launch = launcher(Kernel.RMSNORM_FWD, x2d)
        y, rstd = launch(x2d, self.weight, self.eps, self.zero_centered_gamma)
        if ctx.needs_backward:
            ctx.saved = NormSaved(x=x, rstd=rstd, weight=self.weight)
        return self._output(ctx, x, y), ()

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        s: NormSaved = ctx.saved
        dy2d, x2d = self._backward_rows(s, dy)
        launch = launcher(Kernel.RMSNORM_BWD, x2d)
        dx, dw = launch(dy2d, x2d, s.weight, s.rstd, self.zero_centered_gamma)
        params = {"weight": dw} if ctx.weight_requires_grad else {}
        return OpGrads(unrows(dx, s.x.shape) if ctx.input_requires_grad else None, params)
