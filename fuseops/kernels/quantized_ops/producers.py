"""The producers with the quantize epilogue (elementwise/activation_quantize.py,
elementwise/norm_quantize.py) as ``fuseops::`` custom ops; each wrapper has its launcher's
signature and returns the ``Emitted`` (with the norms' statistics) the launcher returns."""

from __future__ import annotations

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import AnyActivation, activation_code, activation_from_code
from fuseops.kernels.quantization.epilogue import Emitted
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantized_ops._args import emitted_present, fake_emitted, filled, into, kept, owned

_EMITTED = "(Tensor, Tensor, Tensor, Tensor"
_FORMAT = "int scaling, int element, bool store_y"


def _emitted(tensors, scaling: Scaling, store_y: bool, out: Emitted | None) -> Emitted:
    return Emitted(*into(out, kept(tensors, emitted_present(scaling, store_y))))


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    """The norms' mean and rstd: float32 (float64 for the float64 reference)."""
    return torch.promote_types(x.dtype, torch.float32)


@fuseops_op(f"activation_quantize_fwd(Tensor x, int act, float alpha, {_FORMAT}) -> {_EMITTED})")
def _activation_op(x, act: int, alpha: float, scaling: int, element: int, store_y: bool):
    emitted = launcher(Kernel.ACTIVATION_QUANTIZE_FWD, x)(
        x, activation_from_code(act), alpha, scaling=Scaling(scaling), element=Element(element), store_y=store_y)
    return owned(filled(emitted, x), (x,))


@torch.library.register_fake("fuseops::activation_quantize_fwd")
def _(x, act, alpha, scaling, element, store_y):
    return fake_emitted(x.shape[0], x.shape[1], x.dtype, x, Scaling(scaling), Element(element), store_y)


def activation_quantize_fwd(x2d: torch.Tensor, act: AnyActivation, alpha: float = 1.0, *, scaling: Scaling,
                            element: Element, store_y: bool, out: Emitted | None = None) -> Emitted:
    """``activation_quantize.activation_quantize_fwd`` (or its reference) through a custom op."""
    tensors = _activation_op(x2d, activation_code(act), float(alpha), int(scaling), int(element), store_y)
    return _emitted(tensors, scaling, store_y, out)


@fuseops_op(f"gated_quantize_fwd(Tensor x, int act, bool interleaved, bool clamped, float limit, float alpha, "
            f"Tensor? probs, {_FORMAT}) -> {_EMITTED})")
def _gated_op(x, act: int, interleaved: bool, clamped: bool, limit: float, alpha: float, probs, scaling: int,
              element: int, store_y: bool):
    emitted = launcher(Kernel.GATED_QUANTIZE_FWD, x)(
        x, activation_from_code(act), interleaved=interleaved, clamped=clamped, limit=limit, alpha=alpha, probs=probs,
        scaling=Scaling(scaling), element=Element(element), store_y=store_y)
    return owned(filled(emitted, x), (x, probs))


@torch.library.register_fake("fuseops::gated_quantize_fwd")
def _(x, act, interleaved, clamped, limit, alpha, probs, scaling, element, store_y):
    return fake_emitted(x.shape[0], x.shape[1] // 2, x.dtype, x, Scaling(scaling), Element(element), store_y)


def gated_quantize_fwd(x2d: torch.Tensor, act: AnyActivation, *, interleaved: bool = False, clamped: bool = False,
                       limit: float = 7.0, alpha: float = 1.0, probs: torch.Tensor | None = None,
                       scaling: Scaling, element: Element, store_y: bool, out: Emitted | None = None) -> Emitted:
    """``activation_quantize.gated_quantize_fwd`` (or its reference) through a custom op."""
    tensors = _gated_op(x2d, activation_code(act), interleaved, clamped, float(limit), float(alpha), probs,
                        int(scaling), int(element), store_y)
    return _emitted(tensors, scaling, store_y, out)


@fuseops_op(f"layernorm_quantize_fwd(Tensor x, Tensor weight, Tensor? bias, float eps, bool zero_centered_gamma, "
            f"{_FORMAT}) -> {_EMITTED}, Tensor, Tensor)")
def _layernorm_op(x, weight, bias, eps: float, zero_centered_gamma: bool, scaling: int, element: int,
                  store_y: bool):
    emitted, mean, rstd = launcher(Kernel.LAYERNORM_QUANTIZE_FWD, x)(
        x, weight, bias, eps, zero_centered_gamma, scaling=Scaling(scaling), element=Element(element),
        store_y=store_y)
    return owned((*filled(emitted, x), mean, rstd), (x, weight, bias))


@torch.library.register_fake("fuseops::layernorm_quantize_fwd")
def _(x, weight, bias, eps, zero_centered_gamma, scaling, element, store_y):
    stats = x.new_empty(x.shape[0], dtype=_stats_dtype(x))
    emitted = fake_emitted(x.shape[0], x.shape[1], x.dtype, x, Scaling(scaling), Element(element), store_y)
    return (*emitted, stats, torch.empty_like(stats))


def layernorm_quantize_fwd(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                           zero_centered_gamma: bool = False, *, scaling: Scaling, element: Element, store_y: bool,
                           out: Emitted | None = None) -> tuple[Emitted, torch.Tensor, torch.Tensor]:
    """``norm_quantize.layernorm_quantize_fwd`` (or its reference) through a custom op."""
    *tensors, mean, rstd = _layernorm_op(x2d, weight, bias, float(eps), zero_centered_gamma, int(scaling),
                                         int(element), store_y)
    return _emitted(tensors, scaling, store_y, out), mean, rstd


@fuseops_op(f"rmsnorm_quantize_fwd(Tensor x, Tensor weight, float eps, bool zero_centered_gamma, {_FORMAT}) "
            f"-> {_EMITTED}, Tensor)")
def _rmsnorm_op(x, weight, eps: float, zero_centered_gamma: bool, scaling: int, element: int, store_y: bool):
    emitted, rstd = launcher(Kernel.RMSNORM_QUANTIZE_FWD, x)(
        x, weight, eps, zero_centered_gamma, scaling=Scaling(scaling), element=Element(element), store_y=store_y)
    return owned((*filled(emitted, x), rstd), (x, weight))


@torch.library.register_fake("fuseops::rmsnorm_quantize_fwd")
def _(x, weight, eps, zero_centered_gamma, scaling, element, store_y):
    emitted = fake_emitted(x.shape[0], x.shape[1], x.dtype, x, Scaling(scaling), Element(element), store_y)
    return (*emitted, x.new_empty(x.shape[0], dtype=_stats_dtype(x)))


def rmsnorm_quantize_fwd(x2d: torch.Tensor, weight: torch.Tensor, eps: float, zero_centered_gamma: bool = False,
                         *, scaling: Scaling, element: Element, store_y: bool,
                         out: Emitted | None = None) -> tuple[Emitted, torch.Tensor]:
    """``norm_quantize.rmsnorm_quantize_fwd`` (or its reference) through a custom op."""
    *tensors, rstd = _rmsnorm_op(x2d, weight, float(eps), zero_centered_gamma, int(scaling), int(element), store_y)
    return _emitted(tensors, scaling, store_y, out), rstd
