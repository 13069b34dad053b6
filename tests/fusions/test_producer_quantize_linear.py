"""Norms and activations hand the next Linear / GroupedLinear its input quantized, under a
recipe only: the plan shows it, results and saved state are the unfused ops', also with
offloading."""

import contextlib
import copy

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.offload import offload_activations
from fuseops.quant import recipes

RECIPES = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]
IDS = [type(r).__name__ for r in RECIPES]
SPLIT = [20, 0, 44]


def _models():
    torch.manual_seed(0)
    return {
        "norm": (fuseops.Sequential(ops.RMSNorm(64), ops.Linear(64, 32)), []),
        "mlp": (fuseops.Sequential(ops.Linear(64, 128), ops.GELU(), ops.Linear(128, 64)), []),
        "layernorm-grouped": (fuseops.Sequential(ops.LayerNorm(64), ops.GroupedLinear(3, 64, 32)), [SPLIT]),
        # A whole expert MLP is ForwardQuantizedGroupedMLP's (test_forward_quantized_grouped_mlp.py).
        "gated-grouped": (
            fuseops.Sequential(ops.Linear(64, 96), ops.SwiGLU(scaled=True), ops.GroupedLinear(3, 48, 64)),
            [torch.rand(64), SPLIT],
        ),
    }


EXPECTED = {
    "norm": [("ForwardNormQuantizeLinear", (0, 1))],
    "mlp": [("Linear", (0,)), ("ForwardActivationQuantizeLinear", (1, 2))],
    "layernorm-grouped": [("ForwardNormQuantizeLinear", (0, 1))],
    "gated-grouped": [("Linear", (0,)), ("ForwardActivationQuantizeLinear", (1, 2))],
}


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_plan_shows_the_fusion_under_a_recipe_only(recipe):
    for name, (model, extras) in _models().items():
        x = torch.randn(64, 64)
        with fuseops.autocast(recipe=recipe):
            model(x, *extras)
        assert model.plan.forward == EXPECTED[name], name
        model(x, *extras)
        fused = {"ForwardNormQuantizeLinear", "ForwardActivationQuantizeLinear"}
        assert not fused & {n for n, _ in model.plan.forward}, name
        # The MLPs' first Linear takes the activation into its own epilogue fusion instead.
        if "norm" in name:
            reason = "no recipe is active, so nothing is quantized"
            assert ("ForwardNormQuantizeLinear", (0, 1), reason) in model.plan.declined


def test_the_quantize_op_casts_at_a_boundary():
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.RMSNorm(64), ops.Quantize(), ops.Linear(64, 32))
    with fuseops.autocast(recipe=recipes.MXFP8()):
        model(torch.randn(8, 64))
    assert model.plan.forward == [("RMSNorm", (0,)), ("ForwardQuantizeLinear", (1, 2))]


def step(model, x, extras, recipe, *, offload=False, grad=True):
    """Outputs, then every gradient, of one step; and the offload stats."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(grad)
    extras = [e.clone().requires_grad_(grad) if isinstance(e, torch.Tensor) and e.is_floating_point() else e for e in extras]
    handle = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(fuseops.autocast(recipe=recipe))
        if offload:
            handle = stack.enter_context(offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None))
        if not grad:
            stack.enter_context(torch.no_grad())
        y = model(x, *extras)
    if not grad:
        return [y], handle
    weights = torch.linspace(-1, 1, y.numel(), dtype=torch.float64, device=y.device).view(y.shape)
    (y.double() * weights).sum().backward()
    extra_grads = [e.grad for e in extras if isinstance(e, torch.Tensor) and e.is_floating_point()]
    return [y.detach(), x.grad, *extra_grads] + [p.grad for p in model.parameters()], handle


def assert_same(got, want, what):
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), f"{what}: output/grad {i} differs"


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_bitwise_the_unfused_ops_with_and_without_grads(recipe):
    for name, (model, extras) in _models().items():
        unfused = copy.deepcopy(model)
        unfused.fuse = False
        x = torch.randn(64, 64)
        # Without grads (and with frozen weights) the block formats are a single pass.
        for grad in (True, False):
            got, _ = step(model, x, extras, recipe, grad=grad)
            assert model.plan.forward == EXPECTED[name]
            assert_same(got, step(unfused, x, extras, recipe, grad=grad)[0], f"{name} grad={grad}")
        model[-1].weight.requires_grad_(False)
        unfused[-1].weight.requires_grad_(False)
        assert_same(step(model, x, extras, recipe)[0], step(unfused, x, extras, recipe)[0], f"{name} frozen")


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_offloaded_state_is_the_unfused_ops_and_gradients_bitwise(recipe):
    for name, (model, extras) in _models().items():
        unfused = copy.deepcopy(model)
        unfused.fuse = False
        x = torch.randn(64, 64)
        want, want_stats = step(unfused, x, extras, recipe, offload=True)
        got, handle = step(model, x, extras, recipe, offload=True)
        assert_same(got, step(model, x, extras, recipe)[0], f"{name} offloaded")
        assert_same(got, want, f"{name} offloaded, against unfused")
        # The same typed records, so the same buffers go to the host (the column-wise copy too).
        stats = handle.stats
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == want_stats.stats["bytes_offloaded"] > 0
        assert stats["tensors_offloaded"] == want_stats.stats["tensors_offloaded"]


@pytest.mark.skipif(not INTERPRET, reason="the interpreter runs only on CPU-only machines")
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_through_triton_kernels(recipe):
    models = _models()
    for name in ("mlp", "gated-grouped"):
        model, extras = models[name]
        unfused = copy.deepcopy(model)
        unfused.fuse = False
        x = torch.randn(64, 64)
        with interpreted_kernels():
            got, _ = step(model, x, extras, recipe)
            want, _ = step(unfused, x, extras, recipe)
        assert model.plan.forward == EXPECTED[name]
        # The activation kernels round y as the plain ones do: bit for bit.
        assert_same(got, want, name)
