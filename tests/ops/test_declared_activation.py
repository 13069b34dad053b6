"""ops.declare_activation: a user's activation, declared once, runs fused in the dense and grouped
GEMM epilogues (forward and dgrad) and passes the shipped activations' property tests; a
declaration whose kernel disagrees with its reference fails them; bad arguments are refused."""

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.elementwise.activation_math import activation_from_code
from fuseops.kernels.elementwise.element_functions import gelu_tanh, silu
from fuseops.moe import expert_layer
from fuseops.quant import recipes
from fuseops.testing import check_activation
from tests.ops.declared_ops import XReGLU, XReLU
from tests.ops.declared_ops import xrelu as _xrelu
from tests.ops.declared_ops import xrelu_grad as _xrelu_grad
from tests.ops.declared_ops import xrelu_reference as _xrelu_reference

needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="the kernels on CPU tensors need TRITON_INTERPRET=1")


@triton.jit
def _wrong_derivative(x):
    pos = x > 0.0
    return tl.where(pos, x * x, 0.5 * x), tl.where(pos, x, 0.5)


@triton.jit
def _drops_nan(x):
    # A NaN fails both comparisons: 0 here where the reference gives NaN.
    pos = x > 0.0
    return tl.where(pos, x * x, tl.where(x <= 0.0, 0.5 * x, 0.0)), tl.where(pos, 2.0 * x, 0.5)


@needs_interpreter
@pytest.mark.parametrize("cls", [XReLU, XReGLU], ids=lambda c: c.__name__)
def test_declared_activation_passes_the_shipped_property_tests(cls):
    check_activation(cls)


@needs_interpreter
def test_declared_gated_activation_interleaved_and_through_expert_layer():
    check_activation(XReGLU(interleaved=True))


@needs_interpreter
def test_the_plan_shows_it_fused_in_both_epilogues():
    model = fuseops.Sequential(ops.Linear(8, 16), XReLU(), ops.Linear(16, 8))
    x = torch.randn(4, 8, requires_grad=True)
    with interpreted_kernels():
        model(x).sum().backward()
    assert ("ForwardLinearBiasActivation", (0, 1)) in model.plan.forward
    grouped = fuseops.Sequential(ops.GroupedLinear(2, 8, 32), XReGLU(), ops.GroupedLinear(2, 16, 8))
    split = torch.tensor([3, 1])
    with interpreted_kernels():
        grouped(x, split, split).sum().backward()
    assert grouped.plan.forward == [("GroupedMLP", (0, 1, 2))] and grouped.plan.backward == [("GroupedMLP", (0, 1, 2))]


@needs_interpreter
def test_a_wrong_derivative_fails():
    Wrong = ops.declare_activation("Wrong", kernel=_wrong_derivative, reference=_xrelu_reference,
                                   reference_grad=_xrelu_grad)
    with pytest.raises(AssertionError, match="the kernels' input gradient"):
        check_activation(Wrong)


@needs_interpreter
def test_a_kernel_unlike_its_reference_fails():
    Unlike = ops.declare_activation("Unlike", kernel=_xrelu, reference=lambda x: torch.where(x > 0, x * x, 0.25 * x),
                                    reference_grad=lambda x: torch.where(x > 0, 2 * x, 0.25))
    with pytest.raises(AssertionError, match="output differs from the reference"):
        check_activation(Unlike)


@needs_interpreter
def test_nan_placed_otherwise_than_by_the_reference_fails():
    DropsNaN = ops.declare_activation("DropsNaN", kernel=_drops_nan, reference=_xrelu_reference,
                                      reference_grad=_xrelu_grad)
    with pytest.raises(AssertionError, match="output has NaN where the reference has not"):
        check_activation(DropsNaN)


def test_reference_gradient_defaults_to_forward_mode_and_may_be_given():
    # Forward mode: torch.where passes the taken branch's tangent alone, so -inf's is 0.5, not
    # the NaN (0 * -inf) reverse mode sends back through the other branch.
    x = torch.tensor([-float("inf"), -2.0, 0.5, 3.0, float("inf")], dtype=torch.float64)
    assert torch.equal(XReLU.act.grad(x), torch.tensor([0.5, 0.5, 1.0, 6.0, float("inf")], dtype=torch.float64))
    assert torch.equal(XReGLU.act.grad(x), XReLU.act.grad(x))


def test_unfused_runs_the_reference_in_float64():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    y = fuseops.Sequential(XReGLU(), fuse=False)(x)
    a, b = x.chunk(2, -1)
    torch.testing.assert_close(y, _xrelu_reference(a.clamp(max=3.0)) * (b.clamp(-3.0, 3.0) + 1), rtol=0, atol=0)


def test_the_int_code_names_the_declaration():
    # Custom ops (torch.compile) carry an activation as its int.
    assert activation_from_code(int(XReLU.act)) is XReLU.act
    assert int(XReLU.act) != int(XReGLU.act)
    with pytest.raises(ValueError, match="act: expected a shipped Activation or a declared activation's code, got 99"):
        activation_from_code(99)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"name": "not a name"}, ValueError, "name: expected a Python identifier for the op class, got 'not a name'"),
    ({"kernel": _xrelu_reference}, TypeError, r"kernel: expected a @triton.jit function \(x\) -> \(f\(x\), f'\(x\)\)"),
    ({"reference": 3}, TypeError, "reference: expected a callable torch function of one tensor, got 3"),
    ({"reference_grad": "d"}, TypeError, "reference_grad: expected None or a callable"),
    ({"gated": 1}, TypeError, "gated: expected a bool, got 1"),
    ({"limit": 2.0}, ValueError, "limit: clamps only the gated form"),
    ({"gated": True, "limit": -1.0}, ValueError, "limit: expected None or a positive finite float, got -1.0"),
    ({"gated": True, "limit": "7"}, TypeError, "limit: expected None or a positive float, got '7'"),
])
def test_bad_declarations_are_refused(kwargs, error, message):
    args = {"name": "Bad", "kernel": _xrelu, "reference": _xrelu_reference, **kwargs}
    with pytest.raises(error, match=message):
        ops.declare_activation(args.pop("name"), **args)


def test_check_activation_refuses_what_is_not_an_activation():
    with pytest.raises(TypeError, match="op: expected an ActivationOp or GatedActivation"):
        check_activation(ops.Linear(2, 2))
    with pytest.raises(ValueError, match="dtype: expected one of"):
        check_activation(XReLU, dtype=torch.float64)


@triton.jit
def _silu(x):
    return silu(x, 1.0)


# The shipped GELU(tanh) and SwiGLU re-declared from their element functions.
GELUTanhAgain = ops.declare_activation("GELUTanhAgain", kernel=gelu_tanh,
                                       reference=functools.partial(F.gelu, approximate="tanh"))
SwiGLUAgain = ops.declare_activation("SwiGLUAgain", kernel=_silu, reference=F.silu, gated=True)


def _steps(model, x, call):
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    y = call(model, x)
    y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).reshape(y.shape))
    return [y, x.grad] + [p.grad for p in model.parameters()]


@needs_interpreter
@pytest.mark.parametrize("recipe", [None, recipes.FP8CurrentScaling(), recipes.MXFP8()],
                         ids=["unquantized", "FP8CurrentScaling", "MXFP8"])
def test_a_redeclared_builtin_computes_what_the_builtin_does_bit_for_bit(recipe):
    # The same element function through the same epilogues: the dense block's and expert_layer's
    # outputs and gradients are the built-in's exactly.
    torch.manual_seed(0)
    x = torch.randn(16, 32)
    dense = fuseops.Sequential(ops.Linear(32, 64), ops.GELU(approximate="tanh"), ops.Linear(64, 32))
    experts = fuseops.Sequential(ops.GroupedLinear(3, 32, 64), ops.SwiGLU(), ops.GroupedLinear(3, 32, 32))
    ids = torch.stack([torch.arange(16) % 3, (torch.arange(16) + 1) % 3], -1)
    weights = torch.rand(16, 2)
    cases = [(dense, GELUTanhAgain(), lambda m, x: m(x)),
             (experts, SwiGLUAgain(), lambda m, x: expert_layer(x, ids, weights, m))]
    for builtin, again, call in cases:
        redeclared = fuseops.Sequential(copy.deepcopy(builtin[0]), again, copy.deepcopy(builtin[2]))
        with interpreted_kernels(), fuseops.autocast(recipe=recipe) if recipe else torch.enable_grad():
            got, ref = _steps(redeclared, x, call), _steps(builtin, x, call)
        for g, r in zip(got, ref, strict=True):
            assert torch.equal(g, r), (type(again).__name__, (g - r).abs().max())


def test_compiles_fullgraph_and_equals_eager():
    # Under torch.compile the grouped kernels are custom ops that carry the activation as its int.
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    experts = fuseops.Sequential(ops.GroupedLinear(3, 16, 64), XReGLU(), ops.GroupedLinear(3, 32, 16))
    dense = fuseops.Sequential(ops.Linear(16, 32), XReLU(), ops.Linear(32, 16))
    ids = torch.stack([torch.randperm(3)[:2] for _ in range(10)])
    weights = torch.rand(10, 2)
    x = torch.randn(10, 16)
    for model, call in ((experts, lambda m, x: expert_layer(x, ids, weights, m)), (dense, lambda m, x: m(x))):
        compiled = torch.compile(functools.partial(call, model), backend="aot_eager", fullgraph=True)
        for got, ref in zip(_steps(model, x, lambda m, x: compiled(x)), _steps(model, x, call), strict=True):
            torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", [XReLU(), XReGLU(), XReGLU(interleaved=True)], ids=lambda o: type(o).__name__)
def test_declared_activation_in_the_cuda_epilogues(op, dtype):
    check_activation(op, dtype=dtype, device="cuda")
