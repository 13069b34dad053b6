"""Check one op against a float64 torch formula: output and every gradient."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

import fuseops
from tests.helpers import assert_close_rel


def devices() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def check_op_against_float64(
    op: fuseops.ops.BasicOp,
    reference: Callable[..., torch.Tensor],
    x_shape: Sequence[int],
    dtype: torch.dtype,
    device: str,
    extra_inputs: Sequence[Any] = (),
    *,
    tol_factor: float = 1.0,
) -> None:
    """``reference(x, params: dict[str, Tensor], *extra_inputs)`` in float64 is the spec.

    The op runs in ``dtype`` on ``device`` through ``fuseops.Sequential``; its output, the
    input gradient, every parameter gradient and every floating extra-input gradient
    must match the float64 reference within the dtype's tolerance.
    """
    op = op.to(device=device, dtype=dtype)
    with torch.no_grad():
        for p in op.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() == 1 and "weight" in _name(op, p) else 0.0))
    x = torch.randn(*x_shape, device=device, dtype=dtype, requires_grad=True)
    extras = [_leaf(e, device) for e in extra_inputs]
    y = fuseops.Sequential(op)(x, *extras)
    if isinstance(y, tuple):
        y = y[0]
    grad_out = torch.randn_like(y)
    y.backward(grad_out)

    x64 = x.detach().double().requires_grad_()
    params64 = {n: p.detach().double().requires_grad_() for n, p in op.named_parameters()}
    extras64 = [e.detach().double().requires_grad_() if _float(e) else e for e in extras]
    y64 = reference(x64, params64, *extras64)
    y64.backward(grad_out.double())

    assert_close_rel(y.detach(), y64.detach(), dtype, tol_factor, what="output")
    assert_close_rel(x.grad, x64.grad, dtype, tol_factor, what="input grad")
    for name, p in op.named_parameters():
        assert_close_rel(p.grad, params64[name].grad, dtype, tol_factor, what=f"{name} grad")
    for i, (e, e64) in enumerate(zip(extras, extras64)):
        if _float(e) and e.requires_grad:
            assert_close_rel(e.grad, e64.grad, dtype, tol_factor, what=f"extra input {i} grad")


def _leaf(e: Any, device: str) -> Any:
    if isinstance(e, torch.Tensor) and e.is_floating_point():
        return e.to(device).detach().requires_grad_()
    return e


def _float(e: Any) -> bool:
    return isinstance(e, torch.Tensor) and e.is_floating_point()


def _name(op: torch.nn.Module, p: torch.nn.Parameter) -> str:
    return next(n for n, q in op.named_parameters() if q is p)


def assert_torch_nn_values(got: torch.Tensor, torch_nn: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``got`` equals torch.nn's values bit for bit (NaN where they are), but where torch's kernels
    are wrong: non-finite where float64's values (``exact``, rounded to the dtype) are finite, or
    NaN where those are inf (torch's GELU(tanh) backward past |x| ~ 1.8e19, torch 2.11's CPU GELU
    at 3e38 and +inf): there ``got`` is float64's. Returns those positions."""
    wrong = (~torch_nn.isfinite() & exact.isfinite()) | (torch_nn.isnan() & exact.isinf())
    torch.testing.assert_close(got[wrong], exact[wrong])
    torch.testing.assert_close(got[~wrong], torch_nn[~wrong], rtol=0, atol=0, equal_nan=True)
    return wrong
