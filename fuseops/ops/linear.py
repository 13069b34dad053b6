"""Linear: ``y = x @ weight.T + bias`` (state dict interchangeable with ``torch.nn.Linear``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fuseops.ops import _checks
from fuseops.ops.op import BasicOp, OpContext, OpGrads, Saved, TensorSpec, activation, parameter


@dataclass(frozen=True)
class LinearSaved(Saved):
    x: torch.Tensor | None = activation()
    weight: torch.Tensor | None = parameter()


def weight_grad(dy2d: torch.Tensor, x2d: torch.Tensor, weight: torch.nn.Parameter, accumulate: bool) -> torch.Tensor | None:
    """``dy^T @ x``; with ``accumulate`` it is added in float32 to ``weight.main_grad``."""
    if not accumulate:
        return dy2d.t() @ x2d
    main_grad = getattr(weight, "main_grad", None)
    if main_grad is None or main_grad.dtype != torch.float32 or main_grad.shape != weight.shape:
        raise ValueError(
            f"weight.main_grad: expected a float32 tensor of shape {list(weight.shape)} "
            f"(allocated by the caller) with accumulate_into_main_grad=True, got "
            f"{None if main_grad is None else (main_grad.dtype, list(main_grad.shape))}"
        )
    if dy2d.is_cuda and dy2d.dtype != torch.float32:
        # cuBLAS accumulates low-precision products straight into a float32 result.
        main_grad.add_(torch.mm(dy2d.t(), x2d, out_dtype=torch.float32))
    else:
        main_grad.addmm_(dy2d.t().float(), x2d.float())
    return None


class Linear(BasicOp):
    """``y = x @ weight.T + bias``.

    Args:
        in_features: size of the input's last dim.
        out_features: size of the output's last dim.
        bias: whether to learn an additive bias [out_features].
        accumulate_into_main_grad: add the weight gradient in float32 to
            ``weight.main_grad`` (allocated by the caller) instead of ``weight.grad``.
    Shapes: x [..., in_features] -> y [..., out_features].
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        accumulate_into_main_grad: bool = False,
    ) -> None:
        super().__init__()
        self.in_features = _checks.positive_int("in_features", in_features)
        self.out_features = _checks.positive_int("out_features", out_features)
        _checks.float_dtype("dtype", dtype)
        self.accumulate_into_main_grad = accumulate_into_main_grad
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = torch.nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # torch.nn.Linear's initialisation, so swapping one for the other changes nothing.
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @property
    def local_gemm(self) -> bool:
        """Whether forward is exactly ``F.linear`` of the local input with the local
        weight and bias (no collectives around it): what GEMM-epilogue fusions need."""
        return True

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        _checks.features("Linear", x, self.in_features)
        _checks.matches_parameters(self, x)
        return x.with_shape(x.shape[:-1] + (self.out_features,))

    def save(self, ctx: OpContext, x: torch.Tensor) -> None:
        """Keep what backward needs: ``x`` for the weight grad, the weight for ``dx``."""
        if ctx.needs_backward:
            ctx.saved = LinearSaved(
                x=x if ctx.weight_requires_grad else None,
                weight=self.weight if ctx.input_requires_grad else None,
            )

    def op_forward(self, ctx: OpContext, x: torch.Tensor, extra_inputs: tuple[Any, ...]):
        self.save(ctx, x)
        return F.linear(x, self.weight, self.bias), ()

    def input_grad(self, ctx: OpContext, dy: torch.Tensor) -> torch.Tensor | None:
        saved: LinearSaved = ctx.saved
        return dy @ saved.weight if ctx.input_requires_grad else None

    def param_grads(self, ctx: OpContext, dy: torch.Tensor, dbias: torch.Tensor | None = None) -> dict[str, torch.Tensor | None]:
        """Weight (and bias) gradients; ``dbias`` when a fused kernel already reduced it."""
        if not ctx.weight_requires_grad:
            return {}
        saved: LinearSaved = ctx.saved
        dy2d = dy.reshape(-1, self.out_features)
        x2d = saved.x.reshape(-1, self.in_features)
        grads = {"weight": weight_grad(dy2d, x2d, self.weight, self.accumulate_into_main_grad)}
        if self.bias is not None:
            grads["bias"] = dbias if dbias is not None else dy2d.sum(0)
        return grads

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        return OpGrads(self.input_grad(ctx, dy), self.param_grads(ctx, dy))
