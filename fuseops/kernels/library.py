"""The grouped GEMM kernels as ``torch.library`` custom ops, so that ``torch.compile`` and
``torch.export`` see each one as a single opaque node with a fake (shape-only) implementation.

Why these: a grouped kernel's torch reference walks the group offsets on the host, and a
Triton launcher's Python (descriptors, grid sizing) is not traceable; wrapped, neither is
traced, and nothing reads the offsets' values while tracing, so split sizes may live in a
device tensor and vary between calls without a recompile. Dense and elementwise references
are plain torch and trace as they are.

Each public function here takes the launcher's arguments: outside a trace it calls the
launcher (or, where Triton does not run, its reference) directly, at no extra host cost;
while ``torch.compile`` traces it calls ``torch.ops.fuseops.<name>``, whose implementation
makes the same choice at run time. Buffers a launcher would write in place (``out=``,
``main_grad=``) are functional under a trace: the op allocates, and the caller's buffer is
updated by a traced ``copy_``/``add_``.

Importing this module registers the ``fuseops::`` operators with ``torch.library``
(``custom_op.py``: from a schema, with a plain implementation), as torch registers its own:
no other side effect, and nothing is compiled or probed.
"""

from __future__ import annotations

import torch

from fuseops.kernels.custom_op import fuseops_op
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import Activation, AnyActivation, activation_code, activation_from_code


def _empty(like: torch.Tensor) -> torch.Tensor:
    """Custom ops cannot return None: an empty tensor stands for an absent output."""
    return like.new_empty(0)


def _into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    return y if out is None else out.copy_(y)


@fuseops_op("grouped_gemm(Tensor a, Tensor b, Tensor offsets, Tensor? bias, Tensor? row_scale, int act, float alpha, "
            "bool save_preact, Tensor? act_grad_input, Tensor? a_rows) -> (Tensor, Tensor)")
def _grouped_gemm_op(
    a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None,
    row_scale: torch.Tensor | None, act: int, alpha: float, save_preact: bool,
    act_grad_input: torch.Tensor | None, a_rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    launch = launcher(Kernel.GROUPED_GEMM, a)
    y, preact = launch(a, b, offsets, bias=bias, row_scale=row_scale, act=activation_from_code(act), alpha=alpha,
                       save_preact=save_preact, act_grad_input=act_grad_input, a_rows=a_rows)
    return y, preact if preact is not None else _empty(a)


def _grouped_rows(a: torch.Tensor, a_rows: torch.Tensor | None) -> int:
    """Rows of a grouped GEMM's output: ``a``'s, or with ``a_rows`` the gathered rows'."""
    return a.shape[0] if a_rows is None else a_rows.shape[0]


@torch.library.register_fake("fuseops::grouped_gemm")
def _(a, b, offsets, bias, row_scale, act, alpha, save_preact, act_grad_input, a_rows):
    M = _grouped_rows(a, a_rows)
    return a.new_empty(M, b.shape[2]), a.new_empty(M, b.shape[2]) if save_preact else _empty(a)


def grouped_gemm(
    a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, *, bias: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None, act: AnyActivation = Activation.IDENTITY, alpha: float = 1.0,
    save_preact: bool = False, act_grad_input: torch.Tensor | None = None, out: torch.Tensor | None = None,
    a_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``gemm/grouped.py``'s ``grouped_gemm`` (or its reference), traceable."""
    if not torch.compiler.is_compiling():
        launch = launcher(Kernel.GROUPED_GEMM, a)
        return launch(a, b, offsets, bias=bias, row_scale=row_scale, act=act, alpha=alpha,
                      save_preact=save_preact, act_grad_input=act_grad_input, out=out, a_rows=a_rows)
    y, preact = _grouped_gemm_op(a, b, offsets, bias, row_scale, activation_code(act), float(alpha), save_preact,
                                 act_grad_input, a_rows)
    return _into(out, y), (preact if save_preact else None)


@fuseops_op("grouped_gemm_gated(Tensor a, Tensor b, Tensor offsets, Tensor? bias, int act, bool interleaved, "
            "bool clamped, float limit, float alpha, Tensor? probs, bool save_preact, Tensor? a_rows) -> (Tensor, Tensor)")
def _grouped_gemm_gated_op(
    a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None, act: int,
    interleaved: bool, clamped: bool, limit: float, alpha: float, probs: torch.Tensor | None,
    save_preact: bool, a_rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    launch = launcher(Kernel.GROUPED_GEMM_GATED, a)
    h, z = launch(a, b, offsets, bias=bias, act=activation_from_code(act), interleaved=interleaved, clamped=clamped,
                  limit=limit, alpha=alpha, probs=probs, save_preact=save_preact, a_rows=a_rows)
    return h, z if z is not None else _empty(a)


@torch.library.register_fake("fuseops::grouped_gemm_gated")
def _(a, b, offsets, bias, act, interleaved, clamped, limit, alpha, probs, save_preact, a_rows):
    M = _grouped_rows(a, a_rows)
    return a.new_empty(M, b.shape[2] // 2), a.new_empty(M, b.shape[2]) if save_preact else _empty(a)


def grouped_gemm_gated(
    a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, *, bias: torch.Tensor | None = None,
    act: AnyActivation, interleaved: bool = False, clamped: bool = False, limit: float = 7.0,
    alpha: float = 1.0, probs: torch.Tensor | None = None, save_preact: bool = False,
    out: torch.Tensor | None = None, a_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``gemm/grouped_gated.py``'s ``grouped_gemm_gated`` (or its reference), traceable."""
    if not torch.compiler.is_compiling():
        launch = launcher(Kernel.GROUPED_GEMM_GATED, a)
        return launch(a, b, offsets, bias=bias, act=act, interleaved=interleaved, clamped=clamped,
                      limit=limit, alpha=alpha, probs=probs, save_preact=save_preact, out=out, a_rows=a_rows)
    h, z = _grouped_gemm_gated_op(a, b, offsets, bias, activation_code(act), interleaved, clamped, float(limit),
                                  float(alpha), probs, save_preact, a_rows)
    return _into(out, h), (z if save_preact else None)


@fuseops_op("grouped_gemm_dgrad_gated(Tensor dy, Tensor b, Tensor offsets, Tensor z, int act, bool interleaved, "
            "bool clamped, float limit, float alpha, Tensor? probs, bool want_h, Tensor? dy_rows) -> (Tensor, Tensor, Tensor)")
def _dgrad_gated_op(
    dy: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, z: torch.Tensor, act: int,
    interleaved: bool, clamped: bool, limit: float, alpha: float, probs: torch.Tensor | None,
    want_h: bool, dy_rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    launch = launcher(Kernel.GROUPED_GEMM_DGRAD_GATED, dy)
    dz, dprobs, h = launch(dy, b, offsets, z, act=activation_from_code(act), interleaved=interleaved, clamped=clamped,
                           limit=limit, alpha=alpha, probs=probs, want_h=want_h, dy_rows=dy_rows)
    return dz, dprobs if dprobs is not None else _empty(dy), h if h is not None else _empty(dy)


@torch.library.register_fake("fuseops::grouped_gemm_dgrad_gated")
def _(dy, b, offsets, z, act, interleaved, clamped, limit, alpha, probs, want_h, dy_rows):
    dprobs = probs.new_empty(probs.shape) if probs is not None else _empty(dy)
    h = z.new_empty(z.shape[0], z.shape[1] // 2) if want_h else _empty(dy)
    return z.new_empty(z.shape), dprobs, h


def grouped_gemm_dgrad_gated(
    dy: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, z: torch.Tensor, *, act: AnyActivation,
    interleaved: bool = False, clamped: bool = False, limit: float = 7.0, alpha: float = 1.0,
    probs: torch.Tensor | None = None, want_h: bool = False, out: torch.Tensor | None = None,
    dy_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``gemm/grouped_gated_bwd.py``'s ``grouped_gemm_dgrad_gated`` (or its reference), traceable."""
    if not torch.compiler.is_compiling():
        launch = launcher(Kernel.GROUPED_GEMM_DGRAD_GATED, dy)
        return launch(dy, b, offsets, z, act=act, interleaved=interleaved, clamped=clamped, limit=limit,
                      alpha=alpha, probs=probs, want_h=want_h, out=out, dy_rows=dy_rows)
    dz, dprobs, h = _dgrad_gated_op(dy, b, offsets, z, activation_code(act), interleaved, clamped, float(limit),
                                    float(alpha), probs, want_h, dy_rows)
    return _into(out, dz), (dprobs if probs is not None else None), (h if want_h else None)


@fuseops_op("grouped_gemm_wgrad(Tensor dy, Tensor x, Tensor offsets, ScalarType out_dtype, Tensor? x_rows, "
            "Tensor? dy_rows) -> Tensor")
def _wgrad_op(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, out_dtype: torch.dtype,
              x_rows: torch.Tensor | None, dy_rows: torch.Tensor | None) -> torch.Tensor:
    return launcher(Kernel.GROUPED_GEMM_WGRAD, dy)(dy, x, offsets, out_dtype=out_dtype, x_rows=x_rows,
                                                   dy_rows=dy_rows)


@torch.library.register_fake("fuseops::grouped_gemm_wgrad")
def _(dy, x, offsets, out_dtype, x_rows, dy_rows):
    return x.new_empty((offsets.shape[0] - 1, dy.shape[1], x.shape[1]), dtype=out_dtype)


def grouped_gemm_wgrad(
    dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, *, main_grad: torch.Tensor | None = None,
    out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, x_rows: torch.Tensor | None = None,
    dy_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """``gemm/grouped_wgrad.py``'s ``grouped_gemm_wgrad`` (or its reference), traceable: under a
    trace dw is made apart in its target's dtype (float32 for ``main_grad``: the sum is rounded
    once, as eagerly) and added to ``main_grad`` or copied into ``out``."""
    if not torch.compiler.is_compiling():
        launch = launcher(Kernel.GROUPED_GEMM_WGRAD, dy)
        return launch(dy, x, offsets, main_grad=main_grad, out=out, out_dtype=out_dtype, x_rows=x_rows,
                      dy_rows=dy_rows)
    if main_grad is not None:
        return main_grad.add_(_wgrad_op(dy, x, offsets, torch.float32, x_rows, dy_rows))
    dtype = out.dtype if out is not None else out_dtype or x.dtype
    return _into(out, _wgrad_op(dy, x, offsets, dtype, x_rows, dy_rows))


@fuseops_op("grouped_bias_grad(Tensor dy, Tensor offsets) -> Tensor")
def _bias_grad_op(dy: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return launcher(Kernel.GROUPED_BIAS_GRAD, dy)(dy, offsets)


@torch.library.register_fake("fuseops::grouped_bias_grad")
def _(dy, offsets):
    return dy.new_empty(offsets.shape[0] - 1, dy.shape[1])


def grouped_bias_grad(dy: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``gemm/grouped_wgrad.py``'s ``grouped_bias_grad`` (or its reference), traceable."""
    if not torch.compiler.is_compiling():
        return launcher(Kernel.GROUPED_BIAS_GRAD, dy)(dy, offsets)
    return _bias_grad_op(dy, offsets)
