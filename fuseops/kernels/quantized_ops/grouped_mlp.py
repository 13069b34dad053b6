"""The MoE expert MLP's fused quantized GEMMs (gemm/grouped_scaled_act.py: FC1 with the
activation and FC2's input quantization in its epilogue; gemm/grouped_scaled_dgrad_gated.py:
FC2's dgrad through the gate, dz emitted quantized) as ``fuseops::`` custom ops; each wrapper
has its launcher's signature."""

from __future__ import annotations

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import AnyActivation, activation_code, activation_from_code
from fuseops.kernels.gemm.grouped_scaled_dgrad_gated import check_split
from fuseops.kernels.quantization.epilogue import Emitted
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantization.operand import Operand
from fuseops.kernels.quantized_ops._args import (
    emitted_present,
    empty_like_none,
    fake_emitted,
    filled,
    into,
    kept,
    operand,
    operand_args,
    operand_schema,
    owned,
)

_GATE = "int act, bool interleaved, bool clamped, float limit, float alpha, Tensor? probs"


@fuseops_op(f"grouped_gemm_scaled_act({operand_schema('a')}, {operand_schema('b')}, Tensor offsets, {_GATE}, "
            "bool gated, Tensor? bias, bool save_preact, int scaling, int element, bool store_y, "
            "ScalarType out_dtype) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _act_op(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, offsets, act: int,
            interleaved: bool, clamped: bool, limit: float, alpha: float, probs, gated: bool, bias,
            save_preact: bool, scaling: int, element: int, store_y: bool, out_dtype: torch.dtype):
    a_op, b_op = operand(a, a_scale, a_outer, a_rps, a_opr), operand(b, b_scale, b_outer, b_rps, b_opr)
    emitted, z = launcher(Kernel.GROUPED_GEMM_SCALED_ACT, a)(
        a_op, b_op, offsets, act=activation_from_code(act), gated=gated, interleaved=interleaved, clamped=clamped,
        limit=limit, alpha=alpha, probs=probs, bias=bias, save_preact=save_preact, scaling=Scaling(scaling),
        element=Element(element), store_y=store_y, out_dtype=out_dtype)
    return owned((*filled(emitted, a), z if z is not None else empty_like_none(a)), (probs, bias))


@torch.library.register_fake("fuseops::grouped_gemm_scaled_act")
def _(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, offsets, act, interleaved, clamped,
      limit, alpha, probs, gated, bias, save_preact, scaling, element, store_y, out_dtype):
    M, N = a.shape[0], b.shape[1]
    emitted = fake_emitted(M, N // 2 if gated else N, out_dtype, a, Scaling(scaling), Element(element), store_y)
    return (*emitted, a.new_empty(M, N, dtype=out_dtype) if save_preact else empty_like_none(a))


def grouped_gemm_scaled_act(a: Operand, b: Operand, offsets: torch.Tensor, *, act: AnyActivation, gated: bool = False,
                            interleaved: bool = False, clamped: bool = False, limit: float = 7.0,
                            alpha: float = 1.0, probs: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                            save_preact: bool = False, scaling: Scaling, element: Element, store_y: bool,
                            out_dtype: torch.dtype, out: Emitted | None = None) -> tuple[Emitted, torch.Tensor | None]:
    """``grouped_scaled_act.grouped_gemm_scaled_act`` (or its reference) through a custom op."""
    *tensors, z = _act_op(*operand_args(a), *operand_args(b), offsets, activation_code(act), interleaved, clamped,
                          float(limit), float(alpha), probs, gated, bias, save_preact, int(scaling), int(element),
                          store_y, out_dtype)
    emitted = Emitted(*into(out, kept(tensors, emitted_present(scaling, store_y))))
    return emitted, z if save_preact else None


@fuseops_op(f"grouped_gemm_scaled_dgrad_gated({operand_schema('a')}, {operand_schema('b')}, Tensor offsets, "
            f"Tensor z, int scaling, {_GATE}, int grad_scaling, int element, bool store_y, ScalarType out_dtype) "
            "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _dgrad_gated_op(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, offsets, z,
                    scaling: int, act: int, interleaved: bool, clamped: bool, limit: float, alpha: float, probs,
                    grad_scaling: int, element: int, store_y: bool, out_dtype: torch.dtype):
    a_op, b_op = operand(a, a_scale, a_outer, a_rps, a_opr), operand(b, b_scale, b_outer, b_rps, b_opr)
    emitted, dprobs = launcher(Kernel.GROUPED_GEMM_SCALED_DGRAD_GATED, a)(
        a_op, b_op, offsets, z, scaling=Scaling(scaling), act=activation_from_code(act), interleaved=interleaved,
        clamped=clamped, limit=limit, alpha=alpha, probs=probs, grad_scaling=Scaling(grad_scaling),
        element=Element(element), store_y=store_y, out_dtype=out_dtype)
    return owned((*filled(emitted, z), dprobs if dprobs is not None else empty_like_none(z)), (z, probs))


@torch.library.register_fake("fuseops::grouped_gemm_scaled_dgrad_gated")
def _(a, a_scale, a_outer, a_rps, a_opr, b, b_scale, b_outer, b_rps, b_opr, offsets, z, scaling, act,
      interleaved, clamped, limit, alpha, probs, grad_scaling, element, store_y, out_dtype):
    F = b.shape[1]
    # The launcher's ValueError, at trace time: it reads a weight's shape, no data.
    check_split(F, Scaling(grad_scaling), interleaved)
    emitted = fake_emitted(a.shape[0], 2 * F, z.dtype, z, Scaling(grad_scaling), Element(element), store_y)
    return (*emitted, probs.new_empty(probs.shape) if probs is not None else empty_like_none(z))


def grouped_gemm_scaled_dgrad_gated(a: Operand, b: Operand, offsets: torch.Tensor, z: torch.Tensor, *,
                                    scaling: Scaling, act: AnyActivation, interleaved: bool = False,
                                    clamped: bool = False, limit: float = 7.0, alpha: float = 1.0,
                                    probs: torch.Tensor | None = None, grad_scaling: Scaling, element: Element,
                                    store_y: bool, out_dtype: torch.dtype) -> tuple[Emitted, torch.Tensor | None]:
    """``grouped_scaled_dgrad_gated.grouped_gemm_scaled_dgrad_gated`` (or its reference) through a custom op."""
    *tensors, dprobs = _dgrad_gated_op(*operand_args(a), *operand_args(b), offsets, z, int(scaling),
                                       activation_code(act), interleaved, clamped, float(limit), float(alpha), probs,
                                       int(grad_scaling), int(element), store_y, out_dtype)
    emitted = Emitted(*kept(tensors, emitted_present(grad_scaling, store_y)))
    return emitted, dprobs if probs is not None else None
