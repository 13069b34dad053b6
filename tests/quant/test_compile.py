"""Quantized layers under torch.compile: float32 weights under torch.autocast and a recipe.
On CPU the compiler traces the quantize and scaled-GEMM references and the result is the
eager one bit for bit. On a GPU the traced references gave wrong weight gradients (FP8
blockwise) and a device-side assert (FP8 current scaling) on the H100 (session 18), so the
dispatcher refuses to trace them there (``refuses_traced_quantized``): dynamo runs those ops
eagerly, and ``fullgraph=True`` stops with an error that says why. The CPU tests force that
refusal to check both sides."""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.kernels import dispatch
from fuseops.moe import permute, unpermute

RECIPES = [fuseops.recipes.FP8CurrentScaling(), fuseops.recipes.FP8Blockwise()]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def moe_case(device: str):
    """A float32 expert MLP (GroupedLinear, SwiGLU, GroupedLinear) with its routing."""
    torch.manual_seed(0)
    E, T, H, I, K = 4, 64, 128, 128, 2
    experts = fuseops.Sequential(ops.GroupedLinear(E, H, 2 * I), ops.SwiGLU(), ops.GroupedLinear(E, I, H)).to(device)
    x = torch.randn(T, H, device=device)
    ids = torch.stack([torch.randperm(E, device=device)[:K] for _ in range(T)])
    dy = torch.randn(T, H, device=device)

    def layer(x):
        x_sorted, splits, row_map = permute(x, ids, E)
        return unpermute(experts(x_sorted, splits, splits), row_map, None)

    return experts, layer, x, dy


def step(fn, params, x, dy, recipe, device):
    for p in params:
        p.grad = None
    x = x.clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16), fuseops.autocast(recipe=recipe):
        y = fn(x)
    (y.float() * dy).sum().backward()
    return [y.detach().float(), x.grad] + [p.grad for p in params]


def assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
def test_compiled_quantized_moe_layer_is_eager_on_cpu(recipe):
    experts, layer, x, dy = moe_case("cpu")
    params = list(experts.parameters())
    eager = step(layer, params, x, dy, recipe, "cpu")
    torch._dynamo.reset()
    assert_same(step(torch.compile(layer, backend="aot_eager"), params, x, dy, recipe, "cpu"), eager)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
def test_a_refused_trace_runs_the_quantized_ops_eagerly(monkeypatch, recipe):
    # The GPU's refusal, forced on CPU: the graph breaks before each quantized op, which runs
    # as in eager (its Triton kernels, on a GPU).
    monkeypatch.setattr(dispatch, "refuses_traced_quantized", lambda t: True)
    experts, layer, x, dy = moe_case("cpu")
    params = list(experts.parameters())
    eager = step(layer, params, x, dy, recipe, "cpu")
    torch._dynamo.reset()
    assert_same(step(torch.compile(layer, backend="aot_eager"), params, x, dy, recipe, "cpu"), eager)


def test_fullgraph_names_the_refused_quantized_kernel(monkeypatch):
    monkeypatch.setattr(dispatch, "refuses_traced_quantized", lambda t: True)
    torch.manual_seed(0)
    linear = ops.Linear(64, 32)
    x = torch.randn(16, 64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: linear(x), backend="aot_eager", fullgraph=True)
    with (pytest.raises(Exception, match="quantized kernels are not traced by torch.compile"),
          torch.autocast("cpu", dtype=torch.bfloat16), fuseops.autocast(recipe=RECIPES[0])):
        compiled(x)


def test_the_refusal_is_for_gpu_tensors():
    assert not dispatch.refuses_traced_quantized(torch.empty(1))
    if torch.cuda.is_available():
        assert dispatch.refuses_traced_quantized(torch.empty(1, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
def test_gpu_compiled_quantized_moe_layer_is_eager(recipe):
    """Session 18's failures (benchmarks/results/session18/call17/): with the refusal, the
    compiled layer runs its quantized ops eagerly and equals the eager layer."""
    experts, layer, x, dy = moe_case(DEVICE)
    params = list(experts.parameters())
    eager = step(layer, params, x, dy, recipe, DEVICE)
    torch._dynamo.reset()
    assert_same(step(torch.compile(layer), params, x, dy, recipe, DEVICE), eager)
