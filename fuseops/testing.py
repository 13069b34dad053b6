"""Property tests an activation's user runs from their own test file: ``check_activation(op)``.

They are the shipped activations' tests, for any activation op (a shipped one, or a class from
``ops.declare_activation``): the reference's float64 gradcheck; the kernels against the reference
in the same dtype on a grid and at edge values (zeros, large magnitudes, infinities and NaN placed
as the reference places them); and the fused plans (the dense GEMM epilogue forward,
its dgrad epilogue, the grouped expert MLP and ``moe.expert_layer``) against the unfused ops and
the float64 reference, unquantized and under FP8 current scaling. A failure raises
AssertionError naming the check, the model and what differs.

The kernels run on a CUDA device, or on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``
set before ``triton`` is first imported); ``interpreted_kernels()`` runs them for CPU tensors in
a user's own code too (elsewhere the CPU runs their torch references).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import torch

from fuseops.exported_names import exported_dir
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.moe.expert_layer import expert_layer
from fuseops.ops.activation import ActivationOp
from fuseops.ops.gated import GatedActivation
from fuseops.ops.grouped_linear import GroupedLinear
from fuseops.ops.linear import Linear
from fuseops.quant.autocast import autocast
from fuseops.quant.recipes import FP8CurrentScaling
from fuseops.sequential import Sequential

# Normwise relative error against the float64 reference (docs' tolerances by dtype; the GEMMs'
# sums in another order make float32's 1e-5 a few times that).
_TOL = {torch.float32: 5e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
# FP8 current scaling, fused against unfused: the same quantized operands, sums in another order.
_FP8_TOL = 2e-2
_EDGES = (0.0, -0.0, 1e4, -1e4, 3e38, -3e38, float("inf"), -float("inf"), float("nan"))
_H, _F, _GROUPS, _SPLIT = 16, 24, 3, (5, 0, 7)

__all__ = ["check_activation", "interpreted_kernels"]


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)


def check_activation(op: ActivationOp | GatedActivation | type, *, dtype: torch.dtype = torch.float32,
                     device: str | None = None, seed: int = 0) -> None:
    """Run every property test on ``op``; raise AssertionError at the first that fails.

    Args:
        op: an activation op (``ActivationOp`` or ``GatedActivation``), or its class (made with no
            arguments), e.g. one returned by ``ops.declare_activation``.
        dtype: the kernels' dtype: float32, float16 or bfloat16.
        device: "cuda" or "cpu"; None: CUDA when available. The CPU needs TRITON_INTERPRET=1.
        seed: the seed of the inputs and parameters (drawn on the CPU; the caller's random
            state is left as it was).

    A ``scaled`` gated op is checked unscaled: the probabilities' product is the gated ops' own
    code, the same for every activation.
    """
    if isinstance(op, type):
        op = op()
    if not isinstance(op, (ActivationOp, GatedActivation)):
        raise TypeError(f"op: expected an ActivationOp or GatedActivation (or its class), got {op!r}")
    if dtype not in _TOL:
        raise ValueError(f"dtype: expected one of {list(_TOL)}, got {dtype}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and not INTERPRET:
        raise RuntimeError("check_activation on the CPU runs the Triton kernels through the interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported, or pass device='cuda'")
    op = copy.deepcopy(op).to(device)
    if getattr(op, "scaled", False):
        op.scaled = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        check_reference_gradient(op)
        # Outside interpreted_kernels: CPU tensors run the references.
        x = _grid(op, dtype)
        reference = _forward_backward(Sequential(copy.deepcopy(op).cpu(), fuse=False), x)
        with interpreted_kernels() if device == "cpu" else contextlib.nullcontext():
            check_kernels_at_edges(op, x.to(device), reference)
            check_fused(op, dtype, device)


def _width(op) -> int:
    """The op's input features for ``_F`` output features."""
    return 2 * _F if isinstance(op, GatedActivation) else _F


def check_reference_gradient(op) -> None:
    """``torch.autograd.gradcheck`` of the unfused op in float64 (the references run there)."""
    model = Sequential(copy.deepcopy(op).cpu(), fuse=False)
    # Away from 0 and from a clamp's edge by more than gradcheck's step: kinks are not differentiable.
    x = torch.randn(3, _width(op), dtype=torch.float64)
    x = torch.where(x.abs() < 1e-3, 0.5, x).requires_grad_()
    if not torch.autograd.gradcheck(model, (x,), eps=1e-6, atol=1e-6, rtol=1e-5, raise_exception=False):
        raise AssertionError(f"{_name(op)}: the reference's backward differs from its finite differences in float64")


def _name(op) -> str:
    return f"{type(op).__name__}({op.extra_repr()})"


def _grid(op, dtype: torch.dtype) -> torch.Tensor:
    """[rows, width] on the CPU: the edge values, then a grid on [-8, 8]; a gated op gets rows
    of width 2 (its a and b, either layout), every edge value against every other."""
    edges = torch.tensor(_EDGES, dtype=torch.float64)
    if isinstance(op, GatedActivation):
        a, b = torch.meshgrid(edges, edges, indexing="ij")
        pairs = torch.stack([a.reshape(-1), b.reshape(-1)], -1)
        x = torch.cat([pairs, torch.linspace(-8, 8, 2 * 64, dtype=torch.float64).reshape(64, 2)])
    else:
        x = torch.cat([edges, torch.linspace(-8, 8, 255, dtype=torch.float64)])[:, None]
    return x.to(dtype)


def _forward_backward(model: Sequential, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, dx)`` for ``dy = 1``."""
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.backward(torch.ones_like(y))
    return y.detach(), x.grad


def check_kernels_at_edges(op, x: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The op's kernels (forward and backward) on ``_grid``'s ``x`` against ``reference``, the
    reference's ``(y, dx)`` in the same dtype: NaN and infinities where it has them, finite
    values close."""
    dtype = x.dtype
    got = _forward_backward(Sequential(op), x)
    for what, got, ref in zip(("output", "input gradient"), got, reference):
        got, ref = got.cpu().double(), ref.cpu().double()
        for mask, kind in ((torch.isnan, "NaN"), (torch.isposinf, "+inf"), (torch.isneginf, "-inf")):
            where = mask(got) != mask(ref)
            if where.any():
                raise AssertionError(f"{_name(op)} {dtype}: the kernels' {what} has {kind} where the reference has not "
                                     f"(or not where it has) at inputs {x[where.any(-1)].cpu().tolist()[:4]}")
        finite = torch.isfinite(ref)
        tol = _TOL[dtype]
        close = (got - ref).abs() <= tol * 10 * (1 + ref.abs())
        if not close[finite].all():
            bad = finite & ~close
            raise AssertionError(f"{_name(op)} {dtype}: the kernels' {what} differs from the reference at inputs "
                                 f"{x[bad.any(-1)].cpu().tolist()[:4]}: {got[bad][:4].tolist()} against "
                                 f"{ref[bad][:4].tolist()}")


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def _step(model: Sequential, x: torch.Tensor, extras: list) -> list[torch.Tensor]:
    """Output, input gradient and every parameter gradient of one forward and backward."""
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    y = model(x, *extras)
    y.backward(torch.cos(torch.arange(y.numel(), device=y.device, dtype=torch.float64)).reshape(y.shape).to(y.dtype))
    return [y, x.grad] + [p.grad for p in model.parameters()]


def _fused_over(steps, index: int) -> bool:
    """Whether the plan's step over op ``index`` is a fusion."""
    return any(s.fusion is not None and s.start <= index < s.stop for s in steps)


def _compare(op, label: str, make: Callable[[], Sequential], x: torch.Tensor, extras: list, index: int,
             dtype: torch.dtype, stages: tuple[bool, bool]) -> None:
    """The model fused against itself unfused and both against float64; the plan fuses op
    ``index`` in the forward and the backward where ``stages`` says so."""
    model = make().to(device=x.device, dtype=dtype)
    unfused = copy.deepcopy(model)
    unfused.fuse = False
    oracle = copy.deepcopy(model).to(device="cpu", dtype=torch.float64)
    oracle.fuse = False
    fused = _step(model, x, extras)
    plan = model.plan
    if stages[0] and not _fused_over(plan.forward_steps, index) or stages[1] and not _fused_over(
            plan.backward_steps, index):
        raise AssertionError(f"{_name(op)} in {label}: the plan does not fuse it: forward {model.plan.forward}, "
                             f"backward {model.plan.backward}, declined {model.plan.declined}")
    plain = _step(unfused, x, extras)
    ref = _step(oracle, x.cpu().double(), [e.cpu() if isinstance(e, torch.Tensor) else e for e in extras])
    names = ["output", "input gradient"] + [f"{n} gradient" for n, _ in model.named_parameters()]
    for name, f, u, r in zip(names, fused, plain, ref, strict=True):
        err, err_unfused = _rel(f, r), _rel(u, r)
        if err > _TOL[dtype] or err_unfused > _TOL[dtype]:
            raise AssertionError(f"{_name(op)} in {label}, {dtype}: {name} relative error against float64 "
                                 f"fused {err:.2e}, unfused {err_unfused:.2e} (tolerance {_TOL[dtype]:.0e})")


def check_fused(op, dtype: torch.dtype, device: str) -> None:
    """The fused plans against the unfused ops and float64 (see the module docstring)."""
    width = _width(op)
    x = torch.randn(12, _H).to(device).to(dtype)
    _compare(op, "Linear + bias + activation (dense GEMM epilogue)",
             lambda: Sequential(Linear(_H, width, bias=True), copy.deepcopy(op)), x, [], 1, dtype,
             (True, isinstance(op, ActivationOp)))
    if isinstance(op, ActivationOp):
        z = torch.randn(12, width).to(device).to(dtype)
        _compare(op, "activation + Linear (the dgrad epilogue applies its derivative)",
                 lambda: Sequential(copy.deepcopy(op), Linear(width, _H)), z, [], 0, dtype, (False, True))
    split = torch.tensor(_SPLIT, device=device)
    rows = sum(_SPLIT)
    xg = torch.randn(rows, _H).to(device).to(dtype)
    def mlp() -> Sequential:
        return Sequential(GroupedLinear(_GROUPS, _H, width), copy.deepcopy(op), GroupedLinear(_GROUPS, _F, _H))

    _compare(op, "GroupedLinear + activation + GroupedLinear (grouped GEMM epilogues)", mlp, xg, [split, split], 1,
             dtype,
             (True, True))
    check_expert_layer(op, mlp, dtype, device)
    check_fp8(op, dtype, device)


def _expert_layer_step(experts: Sequential, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> list:
    x = x.detach().clone().requires_grad_()
    experts.zero_grad(set_to_none=True)
    y = expert_layer(x, ids, weights, experts)
    y.backward(torch.ones_like(y))
    return [y, x.grad] + [p.grad for p in experts.parameters()]


def check_expert_layer(op, mlp: Callable[[], Sequential], dtype: torch.dtype, device: str) -> None:
    """``moe.expert_layer`` (its fused Function for a gated op) against the float64 composition."""
    experts = mlp().to(device=device, dtype=dtype)
    oracle = copy.deepcopy(experts).to(device="cpu", dtype=torch.float64)
    oracle.fuse = False
    tokens = 8
    x = torch.randn(tokens, _H).to(device).to(dtype)
    ids = torch.stack([torch.arange(tokens) % _GROUPS, (torch.arange(tokens) + 1) % _GROUPS], -1).to(device)
    weights = torch.rand(tokens, 2).to(device)
    got = _expert_layer_step(experts, x, ids, weights)
    ref = _expert_layer_step(oracle, x.cpu().double(), ids.cpu(), weights.cpu().double())
    for i, (g, r) in enumerate(zip(got, ref, strict=True)):
        if _rel(g, r) > _TOL[dtype]:
            raise AssertionError(f"{_name(op)} in moe.expert_layer, {dtype}: result {i} (output, input gradient, "
                                 f"parameter gradients) relative error {_rel(g, r):.2e} against float64")


def check_fp8(op, dtype: torch.dtype, device: str) -> None:
    """Under FP8 current scaling: the activation's fused plans against the unfused ops."""
    width = _width(op)
    features = width // 2 if isinstance(op, GatedActivation) else width
    model = Sequential(copy.deepcopy(op), Linear(features, 32)).to(device=device, dtype=dtype)
    unfused = copy.deepcopy(model)
    unfused.fuse = False
    z = torch.randn(32, width).to(device).to(dtype)
    with autocast(recipe=FP8CurrentScaling()):
        fused, plain = _step(model, z, []), _step(unfused, z, [])
    if not any(s.fusion is not None for s in model.plan.forward_steps + model.plan.backward_steps):
        raise AssertionError(f"{_name(op)} + Linear under FP8 current scaling: the plan fuses nothing: "
                             f"forward {model.plan.forward}, backward {model.plan.backward}")
    for i, (f, u) in enumerate(zip(fused, plain, strict=True)):
        if _rel(f, u) > _FP8_TOL:
            raise AssertionError(f"{_name(op)} + Linear under FP8 current scaling, {dtype}: result {i} fused "
                                 f"against unfused relative error {_rel(f, u):.2e}")
