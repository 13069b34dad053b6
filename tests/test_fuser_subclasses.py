"""A user's subclass of a shipped op is fused as its parent only when it declares that it computes
what its parent does (``computes_as_parent = True``); otherwise it runs its own forward and backward,
and ``plan.declined`` says why. Compared with float64 torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import ops
from fuseops.fusions import REGISTRY
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.ops.activation import ActivationSaved
from fuseops.ops.contract import OpGrads
from fuseops.ops.op import BasicOp


class DoubledGELU(ops.GELU):
    def op_forward(self, ctx, x, extra_inputs):
        y, extra = super().op_forward(ctx, x, extra_inputs)
        return 2 * y, extra

    def op_backward(self, ctx, dy, extra_output_grads):
        return super().op_backward(ctx, 2 * dy, extra_output_grads)


class HalfReLU(ops.ActivationOp):
    """An ``ActivationOp`` of the user's own, with the ``act`` of a shipped one and its own math."""

    act = Activation.RELU

    def op_forward(self, ctx, x, extra_inputs):
        ctx.saved = ActivationSaved(x=x)
        return 0.5 * torch.relu(x), ()

    def op_backward(self, ctx, dy, extra_output_grads):
        return OpGrads(0.5 * dy * (ctx.saved.x > 0).to(dy.dtype))


class SiLUWithoutAct(ops.ActivationOp):
    """No ``act`` at all: nothing a fusion could read."""

    def op_forward(self, ctx, x, extra_inputs):
        ctx.saved = ActivationSaved(x=x)
        return F.silu(x), ()

    def op_backward(self, ctx, dy, extra_output_grads):
        s = torch.sigmoid(ctx.saved.x)
        return OpGrads(dy * s * (1 + ctx.saved.x * (1 - s)))


class ScaledLinear(ops.Linear):
    """A Linear whose output is scaled: ``ForwardLinearBiasActivation`` must not take it."""

    def op_forward(self, ctx, x, extra_inputs):
        y, extra = super().op_forward(ctx, x, extra_inputs)
        return 3 * y, extra

    def op_backward(self, ctx, dy, extra_output_grads):
        return super().op_backward(ctx, 3 * dy, extra_output_grads)


class TripledSwiGLU(ops.SwiGLU):
    def op_forward(self, ctx, x, extra_inputs):
        y, extra = super().op_forward(ctx, x, extra_inputs)
        return 3 * y, extra

    def op_backward(self, ctx, dy, extra_output_grads):
        return super().op_backward(ctx, 3 * dy, extra_output_grads)


class NamedGELU(ops.GELU):
    """Changes only how it prints, and says so: fusions take it as a GELU."""

    computes_as_parent = True

    def extra_repr(self) -> str:
        return "named"


class UndeclaredChildOfDeclared(NamedGELU):
    def op_forward(self, ctx, x, extra_inputs):
        y, extra = super().op_forward(ctx, x, extra_inputs)
        return y + 1, extra


def _dense(act: BasicOp, first=ops.Linear) -> fuseops.Sequential:
    torch.manual_seed(0)
    return fuseops.Sequential(first(8, 16), act, ops.Linear(16, 8))


def _reference(model: fuseops.Sequential, x: torch.Tensor, act, scale_first: float = 1.0) -> torch.Tensor:
    """The model in float64 torch: ``act`` is the activation's own math."""
    w1, b1 = model[0].weight.double(), model[0].bias.double()
    w2, b2 = model[2].weight.double(), model[2].bias.double()
    return F.linear(act(scale_first * F.linear(x, w1, b1)), w2, b2)


CASES = [
    pytest.param(lambda: _dense(DoubledGELU()), lambda z: 2 * F.gelu(z), 1.0, id="gelu-own-forward"),
    pytest.param(lambda: _dense(HalfReLU()), lambda z: 0.5 * torch.relu(z), 1.0, id="activation-with-act"),
    pytest.param(lambda: _dense(SiLUWithoutAct()), F.silu, 1.0, id="activation-without-act"),
    pytest.param(lambda: _dense(ops.GELU(), first=ScaledLinear), F.gelu, 3.0, id="linear-own-forward"),
    pytest.param(lambda: _dense(UndeclaredChildOfDeclared()), lambda z: F.gelu(z) + 1, 1.0, id="child-of-declared"),
]


@pytest.mark.parametrize("make, act, scale_first", CASES)
def test_a_subclass_with_its_own_math_runs_its_own_code(make, act, scale_first):
    model = make()
    x = torch.randn(5, 8, dtype=torch.float64)
    x32 = x.float().requires_grad_()
    y = model(x32)
    unfused = fuseops.Sequential(*model, fuse=False)(x32)
    user_op = next(i for i, op in enumerate(model) if not type(op).fusible)
    steps = model.plan.forward + model.plan.backward
    assert all(positions == (user_op,) for _, positions in steps if user_op in positions)
    assert any(f"op {user_op}: " in reason and "computes_as_parent" in reason for *_, reason in model.plan.declined)
    torch.testing.assert_close(y, unfused)
    xr = x.clone().requires_grad_()
    ref = _reference(model, xr, act, scale_first)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(ref)
    (y * dy.float()).sum().backward()
    (ref * dy).sum().backward()
    torch.testing.assert_close(x32.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)


def test_a_declared_subclass_is_fused_as_its_parent():
    model = _dense(NamedGELU())
    x = torch.randn(5, 8, requires_grad=True)
    y = model(x)
    assert model.plan.forward[0] == ("ForwardLinearBiasActivation", (0, 1))
    torch.testing.assert_close(y, _dense(ops.GELU())(x))


def test_a_grouped_mlp_with_a_user_activation_runs_it():
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.GroupedLinear(2, 4, 8), TripledSwiGLU(), ops.GroupedLinear(2, 4, 4))
    x = torch.randn(6, 4, dtype=torch.float64)
    split = [2, 4]
    y = model(x.float(), split, split)
    assert [name for name, _ in model.plan.forward] == ["GroupedLinear", "TripledSwiGLU", "GroupedLinear"]
    w1, w2 = model[0].weight.double(), model[2].weight.double()
    rows = []
    for g, part in enumerate(x.split(split)):
        a, b = (part @ w1[g].T).chunk(2, -1)
        rows.append((3 * F.silu(a) * b) @ w2[g].T)
    torch.testing.assert_close(y.double(), torch.cat(rows), rtol=1e-5, atol=1e-5)


def test_under_torch_compile_the_subclass_runs_its_own_code():
    model = _dense(DoubledGELU())
    x = torch.randn(5, 8)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), fuseops.Sequential(*model, fuse=False)(x))


def _pattern_classes() -> set[type[BasicOp]]:
    return {cls for fusion in REGISTRY for element in type(fusion).pattern for cls in element.types}


@pytest.mark.parametrize("cls", sorted(_pattern_classes(), key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_class_a_fusion_takes_refuses_an_undeclared_subclass(cls):
    own = type(f"User{cls.__name__}", (cls,), {"__module__": "user_code", "op_forward": cls.op_forward})
    declared = type(f"Declared{cls.__name__}", (cls,), {"__module__": "user_code", "computes_as_parent": True})
    assert cls.fusible and declared.fusible and not own.fusible
    assert "computes_as_parent" in own.unfusible_reason() and declared.unfusible_reason() is None


def test_the_expert_layer_runs_a_user_activation_as_the_composition():
    torch.manual_seed(0)
    E, H, F_, T, K = 3, 8, 6, 10, 2
    experts = fuseops.Sequential(ops.GroupedLinear(E, H, 2 * F_), TripledSwiGLU(), ops.GroupedLinear(E, F_, H))
    x = torch.randn(T, H, dtype=torch.float64)
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
    weights = torch.rand(T, K, dtype=torch.float64)
    reason = fuseops.moe.expert_layer_fallback(x.float(), ids, weights.float(), experts)
    assert reason is not None and "TripledSwiGLU" in reason and "computes_as_parent" in reason
    y = fuseops.moe.expert_layer(x.float(), ids, weights.float(), experts)
    w1, w2 = experts[0].weight.double(), experts[2].weight.double()
    want = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for k in range(K):
            a, b = (x[t] @ w1[ids[t, k]].T).chunk(2)
            want[t] += weights[t, k] * ((3 * F.silu(a) * b) @ w2[ids[t, k]].T)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
