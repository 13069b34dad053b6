"""The scaled GEMMs (gemm/dense_scaled.py, gemm/grouped_scaled.py, gemm/grouped_scaled_wgrad.py
and their sm_90 rows) as ``fuseops::`` custom ops; each wrapper has its launcher's signature.

A ``main_grad`` is not mutated by an op: the op accumulates into a copy of it with the very
launch eager makes (so the sum is bit for bit eager's, whichever tile the accumulating launch
picks) and the wrapper copies the result back.
"""

from __future__ import annotations

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand
from fuseops.kernels.quantized_ops._args import operand, operand_args, operand_schema


def _accumulated(main_grad: torch.Tensor | None, out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    if main_grad is not None:
        return main_grad.copy_(result)
    return out.copy_(result) if out is not None else result


@fuseops_op(f"gemm_scaled({operand_schema('a')}, {operand_schema('b')}, int scaling, ScalarType out_dtype, "
            "Tensor? bias, Tensor? main_grad) -> Tensor")
def _gemm_scaled_op(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, scaling: int,
                    out_dtype: torch.dtype, bias: torch.Tensor | None, main_grad: torch.Tensor | None) -> torch.Tensor:
    a_op, b_op = operand(a, a_scale, a_outer, a_rps, a_opr), operand(b, b_scale, b_outer, b_rps, b_opr)
    mg = main_grad.clone() if main_grad is not None else None
    return launcher(Kernel.GEMM_SCALED, a)(a_op, b_op, scaling=Scaling(scaling), out_dtype=out_dtype, bias=bias,
                                           main_grad=mg)


@torch.library.register_fake("fuseops::gemm_scaled")
def _(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, scaling, out_dtype, bias, main_grad):
    if main_grad is not None:
        return main_grad.new_empty(main_grad.shape)
    return a.new_empty(a.shape[0], b.shape[0], dtype=out_dtype)


def gemm_scaled(a: Operand, b: Operand, *, scaling: Scaling, out_dtype: torch.dtype,
                bias: torch.Tensor | None = None, main_grad: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``dense_scaled.gemm_scaled`` (or its reference) through ``fuseops::gemm_scaled``."""
    y = _gemm_scaled_op(*operand_args(a), *operand_args(b), int(scaling), out_dtype, bias, main_grad)
    return _accumulated(main_grad, out, y)


@fuseops_op(f"grouped_gemm_scaled({operand_schema('a')}, {operand_schema('b')}, Tensor offsets, int scaling, "
            "ScalarType out_dtype, Tensor? bias) -> Tensor")
def _grouped_gemm_scaled_op(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr,
                            offsets: torch.Tensor, scaling: int, out_dtype: torch.dtype,
                            bias: torch.Tensor | None) -> torch.Tensor:
    a_op, b_op = operand(a, a_scale, a_outer, a_rps, a_opr), operand(b, b_scale, b_outer, b_rps, b_opr)
    return launcher(Kernel.GROUPED_GEMM_SCALED, a)(a_op, b_op, offsets, scaling=Scaling(scaling),
                                                   out_dtype=out_dtype, bias=bias)


@torch.library.register_fake("fuseops::grouped_gemm_scaled")
def _(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, offsets, scaling, out_dtype, bias):
    return a.new_empty(a.shape[0], b.shape[1], dtype=out_dtype)


def grouped_gemm_scaled(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                        out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """``grouped_scaled.grouped_gemm_scaled`` (or its reference) through ``fuseops::grouped_gemm_scaled``."""
    y = _grouped_gemm_scaled_op(*operand_args(a), *operand_args(b), offsets, int(scaling), out_dtype, bias)
    return out.copy_(y) if out is not None else y


@fuseops_op(f"grouped_gemm_scaled_wgrad({operand_schema('a')}, {operand_schema('b')}, Tensor offsets, "
            "int scaling, ScalarType out_dtype, Tensor? main_grad) -> Tensor")
def _wgrad_op(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, offsets: torch.Tensor,
              scaling: int, out_dtype: torch.dtype, main_grad: torch.Tensor | None) -> torch.Tensor:
    a_op, b_op = operand(a, a_scale, a_outer, a_rps, a_opr), operand(b, b_scale, b_outer, b_rps, b_opr)
    mg = main_grad.clone() if main_grad is not None else None
    return launcher(Kernel.GROUPED_GEMM_SCALED_WGRAD, a)(a_op, b_op, offsets, scaling=Scaling(scaling),
                                                         out_dtype=out_dtype, main_grad=mg)


@torch.library.register_fake("fuseops::grouped_gemm_scaled_wgrad")
def _(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, offsets, scaling, out_dtype, main_grad):
    if main_grad is not None:
        return main_grad.new_empty(main_grad.shape)
    return a.new_empty(offsets.shape[0] - 1, a.shape[0], b.shape[0], dtype=out_dtype)


def grouped_gemm_scaled_wgrad(a: Operand, b: Operand, offsets: torch.Tensor, *, scaling: Scaling,
                              out_dtype: torch.dtype, main_grad: torch.Tensor | None = None,
                              out: torch.Tensor | None = None) -> torch.Tensor:
    """``grouped_scaled_wgrad.grouped_gemm_scaled_wgrad`` (or its reference) through
    ``fuseops::grouped_gemm_scaled_wgrad``."""
    dw = _wgrad_op(*operand_args(a), *operand_args(b), offsets, int(scaling), out_dtype, main_grad)
    return _accumulated(main_grad, out, dw)
