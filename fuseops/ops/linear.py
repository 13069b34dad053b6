"""Linear: ``y = x @ weight.T + bias`` (state dict interchangeable with ``torch.nn.Linear``)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fuseops.ops import _autocast, _checks
from fuseops.ops._quantized import QuantizedLinearSaved, quantize_grad, quantized_forward, quantized_wgrad
from fuseops.ops.contract import OpContext, OpGrads, Saved, TensorSpec, activation, parameter
from fuseops.ops.op import BasicOp
from fuseops.ops.parallel.tensor_parallel import TensorParallel
from fuseops.ops.shape import rows
from fuseops.quant import linear_dgrad
from fuseops.quant.storage import QuantizedTensor


@dataclass(frozen=True)
class LinearSaved(Saved):
    x: torch.Tensor | None = activation()
    weight: torch.Tensor | None = parameter()


def weight_grad(dy2d: torch.Tensor, x2d: torch.Tensor, weight: torch.nn.Parameter, accumulate: bool) -> torch.Tensor | None:
    """``dy^T @ x`` in ``weight``'s dtype; with ``accumulate`` it is added in float32 to
    ``weight.main_grad``."""
    if not accumulate:
        if weight.dtype != torch.float32 or dy2d.dtype not in (torch.bfloat16, torch.float16):
            return dy2d.t() @ x2d
        # Under autocast, a float32 weight's gradient from 16-bit operands: the float32 sums
        # themselves (cuBLAS writes them; on CPU the operands are widened), not a cast of a
        # 16-bit product.
        if dy2d.is_cuda:
            return torch.mm(dy2d.t(), x2d, out_dtype=torch.float32)
        return dy2d.t().float() @ x2d.float()
    main_grad = _checks.main_grad(weight)
    if dy2d.is_cuda and dy2d.dtype != torch.float32:
        # cuBLAS accumulates low-precision products straight into a float32 result.
        main_grad.add_(torch.mm(dy2d.t(), x2d, out_dtype=torch.float32))
    else:
        main_grad.addmm_(dy2d.t().float(), x2d.float())
    return None


def compute_dtype(x: TensorSpec) -> torch.dtype:
    """The dtype a matmul-class op computes in and returns: the autocast dtype under
    ``torch.autocast`` (for an input autocast casts), else the input's."""
    if x.autocast is not None and x.dtype in _autocast.ELIGIBLE:
        return x.autocast
    return x.dtype


class Linear(_autocast.AutocastParameters, BasicOp):
    """``y = x @ weight.T + bias``.

    Args:
        in_features: size of the input's last dim.
        out_features: size of the output's last dim.
        bias: whether to learn an additive bias [out_features].
        accumulate_into_main_grad: add the weight gradient in float32 to
            ``weight.main_grad`` (allocated by the caller) instead of ``weight.grad``.
        tensor_parallel_mode: ``None``, ``"column"`` (weight [out/P, in], bias [out/P],
            output features split over the P ranks) or ``"row"`` (weight [out, in/P],
            input features split, the outputs summed over the ranks, then the whole bias
            added). Megatron-style; see ``fuseops/ops/parallel/tensor_parallel.py``.
        tensor_parallel_group: the ``torch.distributed`` process group of the P ranks;
            required with ``tensor_parallel_mode``.
        sequence_parallel: the activations outside a column/row pair are split over
            the ranks along the first (sequence) dim: column parallel all-gathers its
            input, row parallel reduce-scatters its output.
    Shapes: x [..., in_features] -> y [..., out_features]; tensor parallel: the local
    shards of those (column: y [..., out/P]; row: x [..., in/P]; with sequence
    parallelism the first dim of column inputs and row outputs is split by P).
    Load a full state dict with ``fuseops.distributed.shard_state_dict``.
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
        tensor_parallel_mode: str | None = None,
        tensor_parallel_group: torch.distributed.ProcessGroup | None = None,
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        self.in_features = _checks.positive_int("in_features", in_features)
        self.out_features = _checks.positive_int("out_features", out_features)
        _checks.float_dtype("dtype", dtype)
        self.accumulate_into_main_grad = accumulate_into_main_grad
        self.tensor_parallel = TensorParallel.build(
            tensor_parallel_mode, tensor_parallel_group, sequence_parallel, in_features, out_features
        )
        if self.tensor_parallel is not None:
            out_features, in_features = self.tensor_parallel.local_shape(in_features, out_features)
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = torch.nn.Parameter(torch.empty(out_features, **factory)) if _checks.flag("bias", bias) else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # torch.nn.Linear's initialisation, so swapping one for the other changes nothing.
        bound = 1 / math.sqrt(self.in_features)
        if self.tensor_parallel is None:
            torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        else:
            # The same bound as the whole layer's (a row shard's own fan-in is in/P).
            torch.nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            torch.nn.init.uniform_(self.bias, -bound, bound)

    @property
    def local_gemm(self) -> bool:
        """Whether forward is exactly ``F.linear`` of the local input with the local
        weight and bias (no collectives around it): what GEMM-epilogue fusions need.

        False for every tensor-parallel mode: row parallel reduces before its bias,
        sequence parallelism gathers and scatters, and column parallel's dgrad needs a
        sum over the ranks that the dgrad-epilogue fusions would skip."""
        return self.tensor_parallel is None

    @property
    def communicates(self) -> bool:  # type: ignore[override]
        """A sharded Linear gathers, scatters or reduces around its GEMM."""
        return self.tensor_parallel is not None

    def extra_repr(self) -> str:
        tp = self.tensor_parallel
        sharded = "" if tp is None else (
            f", tensor_parallel_mode={tp.mode.value!r}, world_size={tp.world_size}, "
            f"sequence_parallel={tp.sequence_parallel}"
        )
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{sharded}"

    def check(self, x: TensorSpec, extra_inputs: tuple[Any, ...]) -> TensorSpec:
        if self.tensor_parallel is not None:
            _checks.matches_parameters(self, x)
            return self.tensor_parallel.output_spec(x, self.in_features, self.out_features)
        _checks.features("Linear", x, self.in_features)
        _checks.matches_parameters(self, x)
        _checks.parameter_shapes(self, {"weight": (self.out_features, self.in_features), "bias": (self.out_features,)})
        out = x.with_shape(x.shape[:-1] + (self.out_features,))
        return out.with_dtype(compute_dtype(x))

    def save(self, ctx: OpContext, x: torch.Tensor, weight: torch.Tensor) -> None:
        """Keep what backward needs: ``x`` for the weight grad, ``weight`` for ``dx``, both
        as the GEMM reads them (``cast_input`` / ``compute_weight``: cast under
        ``torch.autocast``; the caller has them already)."""
        if ctx.needs_backward:
            ctx.saved = LinearSaved(
                x=x if ctx.weight_requires_grad else None,
                weight=weight if ctx.input_requires_grad else None,
            )

    def op_forward(self, ctx: OpContext, x: Any, extra_inputs: tuple[Any, ...]):
        x = _autocast.cast_input(ctx.autocast, x)
        weight, bias = self.compute_weight(ctx), self.compute_bias(ctx)
        if ctx.recipe is not None:
            gemm = functools.partial(self._quantized_gemm, ctx)
        else:
            self.save(ctx, x, weight)
            gemm = F.linear
        if self.tensor_parallel is not None:
            # The collectives stay in x's dtype around the (quantized or not) local GEMM.
            return self.tensor_parallel.forward(x, weight, bias, gemm=gemm), ()
        return gemm(x, weight, bias), ()

    def _quantized_gemm(
        self, ctx: OpContext, x: torch.Tensor | QuantizedTensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``F.linear`` on the recipe's formats, keeping the column-wise copies for backward.

        ``x`` may arrive already quantized (a producer emitted it). Under tensor
        parallelism it is the local GEMM's input (gathered first with column SP), quantized
        here on its own: per-tensor scales come from this rank's operand, as they would
        for any one unparallel GEMM, so no amax is reduced over the ranks.
        """
        x2d = x if isinstance(x, QuantizedTensor) else x.reshape(-1, x.shape[-1]).contiguous()
        y, saved = quantized_forward(
            ctx.recipe, x2d, weight, bias,
            need_dgrad=ctx.input_requires_grad, need_wgrad=ctx.weight_requires_grad,
        )
        if ctx.needs_backward:
            ctx.saved = saved
        return y.view(*x.shape[:-1], weight.shape[0])

    def quantize_grad(self, ctx: OpContext, dy: torch.Tensor) -> QuantizedTensor | None:
        """``dy`` in the recipe's gradient format when forward ran quantized, else None;
        quantized once for both GEMMs (with SP, row parallel passes the gathered ``dy``)."""
        if not isinstance(ctx.saved, QuantizedLinearSaved):
            return None
        dy2d = dy.reshape(-1, self.weight.shape[0]).contiguous()
        return quantize_grad(ctx.saved, dy2d, need_dgrad=ctx.input_requires_grad, need_wgrad=ctx.weight_requires_grad)

    def input_grad(self, ctx: OpContext, dy: torch.Tensor, qdy: QuantizedTensor | None = None) -> torch.Tensor | None:
        """``dy @ weight``; from the quantized copies when ``qdy`` is given."""
        if not ctx.input_requires_grad:
            return None
        if qdy is not None:
            return linear_dgrad(qdy, ctx.saved.weight).view(*dy.shape[:-1], self.weight.shape[1])
        return dy @ ctx.saved.weight

    def param_grads(
        self, ctx: OpContext, dy: torch.Tensor, dbias: torch.Tensor | None = None, *, qdy: QuantizedTensor | None = None
    ) -> dict[str, torch.Tensor | None]:
        """Weight (and bias) gradients; ``dbias`` when a fused kernel already reduced it;
        the weight's from the quantized copies when ``qdy`` is given."""
        if not ctx.weight_requires_grad:
            return {}
        saved = ctx.saved
        out_features, in_features = self.weight.shape
        dy2d = rows(dy, out_features)
        if qdy is not None:
            main_grad = _checks.main_grad(self.weight) if self.accumulate_into_main_grad else None
            # The parameter's dtype: under torch.autocast a float32 weight's gradient is the
            # scaled GEMM's float32 result, not a bf16 rounding of it.
            grads = {"weight": quantized_wgrad(saved, qdy, out_dtype=self.weight.dtype, main_grad=main_grad)}
        else:
            x2d = rows(saved.x, in_features)
            grads = {"weight": weight_grad(dy2d, x2d, self.weight, self.accumulate_into_main_grad)}
        if self.bias is not None:
            grads["bias"] = dbias if dbias is not None else dy2d.sum(0)
        return grads

    def op_backward(self, ctx: OpContext, dy: torch.Tensor, extra_output_grads) -> OpGrads:
        if self.tensor_parallel is not None:
            return OpGrads(*self.tensor_parallel.backward(self, ctx, dy))
        qdy = self.quantize_grad(ctx, dy)
        return OpGrads(self.input_grad(ctx, dy, qdy), self.param_grads(ctx, dy, qdy=qdy))
