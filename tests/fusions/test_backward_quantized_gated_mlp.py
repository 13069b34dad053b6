"""The gated expert MLP's backward under a recipe: FC2's quantized dgrad applies the gate's
derivative and emits FC1's quantized output gradient. The plan shows it under a recipe
only, for gated activations and F a multiple of the gradient block (or interleaved); outputs and every gradient are the unfused ops' bit for bit on the torch
reference path (with frozen weights, main_grad, and after either forward plan), and within
float32 rounding of them through the Triton kernels.

Its guard declines every format by measurement (the module's ``DECLINED``): the tests below
switch that off to check the fusion itself, and one checks the default."""

import copy

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.fusions import backward_quantized_gated_mlp
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.quant import recipes
from tests.fusions.test_producer_quantize_linear import assert_same, step
from tests.helpers import REL_TOL, rel_err

RECIPES = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]
IDS = [type(r).__name__ for r in RECIPES]
SPLIT = [20, 0, 44]
FUSED = ("BackwardQuantizedGatedMLP", (0, 1, 2))
GATES = {
    "swiglu-scaled": lambda: ops.SwiGLU(scaled=True),
    "geglu": lambda: ops.GeGLU(),
    "clamped-interleaved-scaled": lambda: ops.ClampedSwiGLU(limit=1.5, interleaved=True, scaled=True),
}


@pytest.fixture(autouse=True)
def fusion_enabled(monkeypatch):
    monkeypatch.setattr(backward_quantized_gated_mlp, "DECLINED", ())


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_declined_by_default_where_it_measured_slower(recipe, monkeypatch):
    monkeypatch.undo()
    model = _model("swiglu-scaled")
    step(model, torch.randn(64, 64), _extras(model), recipe)
    assert FUSED not in model.plan.backward
    scaling = recipe.format(recipes.TensorRole.GRAD).scaling.name
    reason = f"{scaling} gradients: the unfused dgrad and gated backward measured faster"
    assert ("BackwardQuantizedGatedMLP", (0, 1, 2), reason) in model.plan.declined


def _model(gate, *, ffn=128, hidden=64, groups=3, dtype=torch.float32, device="cpu", fc2_bias=True,
           main_grad=False, fc1_bias=False):
    torch.manual_seed(0)
    model = fuseops.Sequential(
        ops.GroupedLinear(groups, hidden, 2 * ffn, bias=fc1_bias, accumulate_into_main_grad=main_grad), GATES[gate](),
        ops.GroupedLinear(groups, ffn, hidden, bias=fc2_bias, accumulate_into_main_grad=main_grad),
    )
    return model.to(device=device, dtype=dtype)


def _extras(model, rows=64, split=SPLIT, device="cpu"):
    probs = [torch.rand(rows, device=device)] if model[1].scaled else []
    return [split, *probs, split]


def _unfused(model):
    unfused = copy.deepcopy(model)
    unfused.fuse = False
    return unfused


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_plan_shows_the_fusion_under_a_recipe_where_it_applies(recipe):
    for gate in GATES:
        model = _model(gate)
        x, extras = torch.randn(64, 64), _extras(model)
        step(model, x, extras, recipe)
        assert FUSED in model.plan.backward, gate
        step(model, x, extras, None)
        assert FUSED not in model.plan.backward
    plain = fuseops.Sequential(ops.GroupedLinear(3, 64, 128), ops.GELU(), ops.GroupedLinear(3, 128, 64))
    step(plain, torch.randn(64, 64), [SPLIT, SPLIT], recipe)
    assert FUSED not in plain.plan.backward


def test_declines_a_block_straddling_the_gate_and_up_halves():
    model = _model("swiglu-scaled", ffn=96)
    step(model, torch.randn(64, 64), _extras(model), recipes.FP8Blockwise())
    reason = "a 128-wide gradient block would straddle z's gate and up halves (F = 96, not interleaved)"
    assert ("BackwardQuantizedGatedMLP", (0, 1, 2), reason) in model.plan.declined
    step(model, torch.randn(64, 64), _extras(model), recipes.MXFP8())
    assert FUSED in model.plan.backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_bitwise_the_unfused_ops(recipe, dtype):
    for gate, fc1_bias in [*((g, False) for g in GATES), ("swiglu-scaled", True)]:
        model = _model(gate, dtype=dtype, fc1_bias=fc1_bias)
        unfused = _unfused(model)
        x, extras = torch.randn(64, 64, dtype=dtype), _extras(model)
        got, _ = step(model, x, extras, recipe)
        assert FUSED in model.plan.backward
        assert_same(got, step(unfused, x, extras, recipe)[0], gate)
        for frozen in (model[2].weight, model[0].weight, model[0].bias):
            if frozen is None:
                continue
            frozen.requires_grad_(False)
            unfused.get_parameter(next(n for n, p in model.named_parameters() if p is frozen)).requires_grad_(False)
            got, _ = step(model, x, extras, recipe)
            assert_same(got, step(unfused, x, extras, recipe)[0], f"{gate} frozen")


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_main_grad_bitwise_the_unfused_ops(recipe):
    model = _model("swiglu-scaled", main_grad=True)
    unfused = _unfused(model)
    x, extras = torch.randn(64, 64), _extras(model)
    grads = []
    for m in (model, unfused):
        for p in (m[0].weight, m[2].weight):
            p.main_grad = torch.ones(p.shape, dtype=torch.float32)
        step(m, x, extras, recipe)
        grads.append([m[0].weight.main_grad, m[2].weight.main_grad])
    assert FUSED in model.plan.backward
    assert_same(*grads, "main_grad")


@pytest.mark.skipif(not INTERPRET, reason="interpreter only on CPU machines")
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_through_the_triton_kernels_within_float32_rounding_of_the_unfused(recipe):
    """Through the kernels the fused dh is rounded as the unfused dgrad stores it, so only
    the order of float32 sums differs (dprobs' partials, the GEMM's tiles)."""
    for gate in ("swiglu-scaled", "clamped-interleaved-scaled"):
        model = _model(gate)
        unfused = _unfused(model)
        x, extras = torch.randn(64, 64), _extras(model)
        with interpreted_kernels():
            got, _ = step(model, x, extras, recipe)
            want, _ = step(unfused, x, extras, recipe)
        assert FUSED in model.plan.backward
        for i, (a, b) in enumerate(zip(got, want)):
            assert rel_err(a, b) <= REL_TOL[torch.float32], f"{gate}: output/grad {i}"


def _close_to_float64(model, x, extras, recipe):
    """Fused within its dtype's tolerance of float64, or no worse than twice the unfused error
    (the dgrads sum in other orders; quantization can turn that into a code step)."""
    got, _ = step(model, x, extras, recipe)
    want, _ = step(_unfused(model), x, extras, recipe)
    exact = _unfused(model).to(device="cpu", dtype=torch.float64)
    exact_extras = [(e.double() if e.is_floating_point() else e).cpu() if isinstance(e, torch.Tensor) else e
                    for e in extras]
    ref, _ = step(exact, x.double().cpu(), exact_extras, None)
    for i, (a, b, c) in enumerate(zip(got, want, ref)):
        err, base = rel_err(a, c.to(a.device)), rel_err(b, c.to(b.device))
        assert err <= max(2 * base, REL_TOL[x.dtype]), f"output/grad {i}: {err:.2e} (unfused {base:.2e})"
    assert FUSED in model.plan.backward


@pytest.mark.gpu
@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_on_cuda(recipe, gate):
    model = _model(gate, dtype=torch.bfloat16, device="cuda", groups=4, hidden=512, ffn=384)
    split = torch.tensor([700, 0, 1300, 48], device="cuda")
    x = torch.randn(2048, 512, dtype=torch.bfloat16, device="cuda")
    _close_to_float64(model, x, _extras(model, 2048, split, "cuda"), recipe)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_no_host_sync_on_cuda(recipe):
    model = _model("swiglu-scaled", dtype=torch.bfloat16, device="cuda")
    x = torch.randn(256, 64, dtype=torch.bfloat16, device="cuda")
    extras = _extras(model, 256, torch.tensor([100, 0, 156], device="cuda"), "cuda")
    step(model, x, extras, recipe)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(model, x, extras, recipe)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert FUSED in model.plan.backward
