"""GroupedLinear: per-group linear layers over contiguous row groups (MoE experts).

Rows of group g (``split_sizes[g]`` of them, in order) use ``weight[g]``. Split sizes
arrive as an extra input: a list, a tuple, a CPU tensor or a device tensor of any
integer dtype. Host split sizes are validated on the host (a ``ValueError`` before any
launch); device split sizes by ``torch._assert_async`` on the device (``FUSEOPS_DEBUG=1``: read
on the host too, a sync); under torch.compile a tensor's by the compiled graph, as eagerly
(``_checks.split_sizes``). Nothing on this path reads device data on the host, so it captures
in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from fuseops.kernels import library
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.ops import _autocast, _checks
from fuseops.ops._quantized import QuantizedLinearSaved, quantized_backward, quantized_forward
from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec, activation, meta, parameter
from fuseops.ops.linear import compute_dtype
from fuseops.ops.op import BasicOp
from fuseops.ops.shape import rows, unrows
from fuseops.quant.storage import QuantizedTensor

SPLIT_SIZES = "GroupedLinear split_sizes"


@dataclass(frozen=True)
class GroupedLinearSaved(Saved):
    x: torch.Tensor | None = activation()
    weight: torch.Tensor | None = parameter()
    offsets: torch.Tensor | None = meta()


def device_offsets(split_sizes: Any, device: torch.device) -> torch.Tensor:
    """int64 [G + 1] group offsets on ``device``; a device tensor never leaves it."""
    if not isinstance(split_sizes, torch.Tensor):
        split_sizes = torch.tensor(list(split_sizes), dtype=torch.int64)
    if split_sizes.device != device:
        split_sizes = split_sizes.to(device, non_blocking=True)
    return launcher(Kernel.GROUP_OFFSETS, split_sizes)(split_sizes)


class GroupedLinear(_autocast.AutocastParameters, BasicOp):
    """``y[rows of g] = x[rows of g] @ weight[g].T + bias[g]``.

    Args:
        num_groups: number of groups G (experts).
        in_features: size of the input's last dim.
        out_features: size of the output's last dim.
        bias: whether to learn a bias [G, out_features].
        accumulate_into_main_grad: add the weight gradient in float32 to
            ``weight.main_grad`` [G, out, in] (allocated by the caller).
    Shapes: x [..., in_features] (leading dims flattened to rows, grouped contiguously),
    split_sizes [G] summing to the row count -> y [..., out_features].
    """

    num_extra_inputs = 1

    def __init__(
        self,
        num_groups: int,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        accumulate_into_main_grad: bool = False,
    ) -> None:
        super().__init__()
        self.num_groups = _checks.positive_int("num_groups", num_groups)
        self.in_features = _checks.positive_int("in_features", in_features)
        self.out_features = _checks.positive_int("out_features", out_features)
        _checks.float_dtype("dtype", dtype)
        self.accumulate_into_main_grad = accumulate_into_main_grad
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(num_groups, out_features, in_features, **factory))
        self.bias = (torch.nn.Parameter(torch.empty(num_groups, out_features, **factory))
                     if _checks.flag("bias", bias) else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Each group initialised as a torch.nn.Linear of the same size would be.
        bound = 1 / math.sqrt(self.in_features)
        torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return (
            f"num_groups={self.num_groups}, in_features={self.in_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        _checks.features("GroupedLinear", x, self.in_features)
        _checks.matches_parameters(self, x)
        G, N = self.num_groups, self.out_features
        _checks.parameter_shapes(self, {"weight": (G, N, self.in_features), "bias": (G, N)})
        _checks.split_sizes(SPLIT_SIZES, extra_inputs[0], self.num_groups, math.prod(x.shape[:-1]), x.device)
        out = x.with_shape(x.shape[:-1] + (self.out_features,))
        return out.with_dtype(compute_dtype(x))

    def offsets(self, split_sizes: Any, x: torch.Tensor | QuantizedTensor, *, check: bool = True) -> torch.Tensor:
        """``device_offsets`` of ``split_sizes`` for the input ``x``, with what ``check`` leaves
        to each call: eagerly, a device tensor's sizes asserted on the device (a call whose
        signature was seen before skips ``check``); while torch.compile traces, split sizes of a
        form the kernels cannot take (which the compiled graph refuses first: ``check``) replaced
        by empty groups, so that tracing goes on. Fused ops make this op's offsets here too.

        Args:
            split_sizes: [G] rows per group: a list, a tuple, or an integer tensor on the CPU
                or ``x``'s device.
            x: the input, [..., in_features] (leading dims are the rows).
            check: assert a device tensor's sizes (False where this op's own forward, which
                asserts them, runs in the same call).
        Returns:
            int64 [G + 1] group offsets on ``x``'s device.
        """
        if torch.compiler.is_compiling():
            if not _checks.usable_split_sizes(split_sizes, self.num_groups):
                split_sizes = [0] * self.num_groups
        elif check and isinstance(split_sizes, torch.Tensor) and split_sizes.device.type != "cpu":
            return _checks.sizes_asserted(SPLIT_SIZES, split_sizes, math.prod(x.shape[:-1]))
        return device_offsets(split_sizes, x.device)

    def save(self, ctx: OpContext, x: torch.Tensor, offsets: torch.Tensor) -> None:
        if ctx.needs_backward:
            ctx.saved = GroupedLinearSaved(
                x=_autocast.cast_input(ctx.autocast, x) if ctx.weight_requires_grad else None,
                weight=self.compute_weight(ctx) if ctx.input_requires_grad else None,
                offsets=offsets,
            )

    def op_forward(self, ctx: OpContext, x: Any, extra_inputs: tuple[Any, ...]):
        offsets = self.offsets(extra_inputs[0], x)
        x = _autocast.cast_input(ctx.autocast, x)
        weight, bias = self.compute_weight(ctx), self.compute_bias(ctx)
        # Under a recipe x may arrive quantized already (a producer emitted it).
        x2d = x if isinstance(x, QuantizedTensor) else rows(x, self.in_features).contiguous()
        if ctx.recipe is not None:
            y, saved = quantized_forward(
                ctx.recipe, x2d, weight, bias, offsets=offsets,
                need_dgrad=ctx.input_requires_grad, need_wgrad=ctx.weight_requires_grad,
            )
            if ctx.needs_backward:
                ctx.saved = saved
        else:
            self.save(ctx, x, offsets)
            y, _ = library.grouped_gemm(x2d, weight.transpose(1, 2), offsets, bias=bias)
        return unrows(y, x.shape[:-1] + (self.out_features,)), ()

    def input_grad(self, ctx: OpContext, dy2d: torch.Tensor, **epilogue: Any) -> torch.Tensor | None:
        """``dx = dy @ weight[g]`` per group; ``epilogue`` goes to the kernel (act grad)."""
        if not ctx.input_requires_grad:
            return None
        s: GroupedLinearSaved = ctx.saved
        dx, _ = library.grouped_gemm(dy2d, s.weight, s.offsets, **epilogue)
        return dx

    def param_grads(
        self, ctx: OpContext, dy2d: torch.Tensor, x2d: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor | None]:
        """Weight (and bias) grads; ``x2d`` when a fused op recomputed the input."""
        if not ctx.weight_requires_grad:
            return {}
        s: GroupedLinearSaved = ctx.saved
        if x2d is None:
            x2d = rows(s.x, self.in_features).contiguous()
        main_grad = _checks.main_grad(self.weight) if self.accumulate_into_main_grad else None
        # dw in the parameter's dtype straight from the kernel's float32 sums: under autocast a
        # float32 weight's gradient, with no bf16 copy and no cast pass after.
        dw = library.grouped_gemm_wgrad(dy2d, x2d, s.offsets, main_grad=main_grad, out_dtype=self.weight.dtype)
        grads = {"weight": None if main_grad is not None else dw}
        if self.bias is not None:
            grads["bias"] = library.grouped_bias_grad(dy2d, s.offsets)
        return grads

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        dy2d = rows(dy, self.out_features).contiguous()
        if isinstance(ctx.saved, QuantizedLinearSaved):
            return self._quantized_backward(ctx, dy, dy2d)
        dx = self.input_grad(ctx, dy2d)
        if dx is not None:
            dx = unrows(dx, dy.shape[:-1] + (self.in_features,))
        return OpGrads(dx, self.param_grads(ctx, dy2d), (None,))

    def _quantized_backward(self, ctx: OpContext, dy: torch.Tensor, dy2d: torch.Tensor) -> OpGrads:
        main_grad = _checks.main_grad(self.weight) if self.accumulate_into_main_grad and ctx.weight_requires_grad else None
        dx, dw = quantized_backward(
            ctx.saved, dy2d, need_dgrad=ctx.input_requires_grad, need_wgrad=ctx.weight_requires_grad,
            main_grad=main_grad, wgrad_dtype=self.weight.dtype,
        )
        params: dict[str, torch.Tensor | None] = {}
        if ctx.weight_requires_grad:
            params["weight"] = dw
            if self.bias is not None:
                params["bias"] = library.grouped_bias_grad(dy2d, ctx.saved.offsets)
        if dx is not None:
            dx = unrows(dx, dy.shape[:-1] + (self.in_features,))
        return OpGrads(dx, params, (None,))
