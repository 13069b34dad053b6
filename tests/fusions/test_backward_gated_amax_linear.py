"""Linear or GroupedLinear -> gated activation, backward, under a per-tensor gradient format: the gated
backward emits dz's row amaxes and FC1 quantizes dz without an amax pass. The plan shows it
for FP8 current scaling and NVFP4 only; outputs and every gradient are the unfused ops' bit for
bit, on the torch reference path and through the Triton kernels (the interpreter on CPU,
CUDA in the gpu tests), with frozen parameters, FC1's bias, main_grad and empty groups."""

import contextlib
import copy

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.quant import recipes
from tests.fusions.test_producer_quantize_linear import assert_same, step
from tests.helpers import cuda_or_skip
from tests.kernels.elementwise.test_gated_activation import assert_same_row_sums

PER_TENSOR = [recipes.FP8CurrentScaling(), recipes.NVFP4()]
IDS = [type(r).__name__ for r in PER_TENSOR]
SPLIT = [20, 0, 44]
PATHS = ["reference"] + (["kernels"] if INTERPRET else [])
GATES = {
    "swiglu-scaled": lambda: ops.SwiGLU(scaled=True),
    "geglu": lambda: ops.GeGLU(),
    "clamped-interleaved-scaled": lambda: ops.ClampedSwiGLU(limit=1.5, interleaved=True, scaled=True),
}


def _model(gate, *, ffn=64, hidden=64, groups=3, dtype=torch.float32, device="cpu", fc1_bias=False,
           main_grad=False, with_fc2=True):
    torch.manual_seed(0)
    layers = [ops.GroupedLinear(groups, hidden, 2 * ffn, bias=fc1_bias, accumulate_into_main_grad=main_grad),
              GATES[gate]()]
    if with_fc2:
        layers.append(ops.GroupedLinear(groups, ffn, hidden))
    return fuseops.Sequential(*layers).to(device=device, dtype=dtype)


def _extras(model, rows=64, split=SPLIT, device="cpu"):
    probs = [torch.rand(rows, device=device)] if model[1].scaled else []
    return [split, *probs] + ([split] if len(model) == 3 else [])


def _unfused(model):
    unfused = copy.deepcopy(model)
    unfused.fuse = False
    return unfused


def _fused(model):
    return ("BackwardGatedAmaxLinear", (0, 1)) in model.plan.backward


def test_plan_shows_it_for_per_tensor_gradient_formats_only():
    model = _model("swiglu-scaled")
    x, extras = torch.randn(64, 64), _extras(model)
    for recipe in PER_TENSOR:
        step(model, x, extras, recipe)
        assert _fused(model), type(recipe).__name__
    for recipe in (recipes.FP8Blockwise(), recipes.MXFP8()):
        step(model, x, extras, recipe)
        assert not _fused(model)
        scaling = recipe.format(recipes.TensorRole.GRAD).scaling.name
        assert ("BackwardGatedAmaxLinear", (0, 1), f"{scaling} gradients have no amax pass to save") in model.plan.declined
    step(model, x, extras, None)
    assert not _fused(model)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("recipe", PER_TENSOR, ids=IDS)
def test_bitwise_the_unfused_ops(recipe, dtype, path):
    cases = [(g, False, True) for g in GATES] + [("swiglu-scaled", True, True), ("swiglu-scaled", False, False)]
    for gate, fc1_bias, with_fc2 in cases:
        model = _model(gate, dtype=dtype, fc1_bias=fc1_bias, with_fc2=with_fc2)
        unfused = _unfused(model)
        x, extras = torch.randn(64, 64, dtype=dtype), _extras(model)
        with interpreted_kernels() if path == "kernels" else contextlib.nullcontext():
            got, _ = step(model, x, extras, recipe)
            assert _fused(model), gate
            assert_same(got, step(unfused, x, extras, recipe)[0], gate)
            # FC1's weight frozen (dz's row-wise copy alone), then x not requiring a gradient
            # (the column-wise copy alone: the basic ops run).
            m, u = copy.deepcopy(model), copy.deepcopy(unfused)
            for p in (m[0].weight, u[0].weight, m[0].bias, u[0].bias):
                if p is not None:
                    p.requires_grad_(False)
            assert_same(step(m, x, extras, recipe)[0], step(u, x, extras, recipe)[0], f"{gate} frozen FC1")
            assert_same(_grads_without_dx(model, x, extras, recipe), _grads_without_dx(unfused, x, extras, recipe),
                        f"{gate} x without grad")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("recipe", PER_TENSOR, ids=IDS)
def test_dense_linear_bitwise_the_unfused_ops(recipe, path):
    for gate, bias in (("swiglu-scaled", True), ("geglu", False), ("clamped-interleaved-scaled", False)):
        torch.manual_seed(0)
        model = fuseops.Sequential(ops.Linear(64, 128, bias=bias), GATES[gate](), ops.Linear(64, 32))
        extras = [torch.rand(48)] if model[1].scaled else []
        unfused = _unfused(model)
        x = torch.randn(48, 64)
        with interpreted_kernels() if path == "kernels" else contextlib.nullcontext():
            got, _ = step(model, x, extras, recipe)
            assert _fused(model), gate
            assert_same(got, step(unfused, x, extras, recipe)[0], gate)
            model[0].weight.requires_grad_(False)
            unfused[0].weight.requires_grad_(False)
            assert_same(step(model, x, extras, recipe)[0], step(unfused, x, extras, recipe)[0], f"{gate} frozen")


def _grads_without_dx(model, x, extras, recipe):
    """Output and parameter gradients of a step whose input needs no gradient."""
    model.zero_grad(set_to_none=True)
    with fuseops.autocast(recipe=recipe):
        y = model(x, *extras)
    y.float().square().sum().backward()
    return [y.detach()] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("recipe", PER_TENSOR, ids=IDS)
def test_main_grad_bitwise_the_unfused_ops(recipe):
    model = _model("swiglu-scaled", main_grad=True)
    unfused = _unfused(model)
    x, extras = torch.randn(64, 64), _extras(model)
    grads = []
    for m in (model, unfused):
        m[0].weight.main_grad = torch.ones(m[0].weight.shape, dtype=torch.float32)
        step(m, x, extras, recipe)
        grads.append([m[0].weight.main_grad])
    assert _fused(model)
    assert_same(*grads, "main_grad")


@pytest.mark.gpu
@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("recipe", PER_TENSOR, ids=IDS)
def test_on_cuda_bitwise_the_unfused_ops(recipe, gate):
    device = cuda_or_skip()
    model = _model(gate, dtype=torch.bfloat16, device=device, groups=4, hidden=512, ffn=384)
    split = torch.tensor([700, 0, 1300, 48], device=device)
    x = torch.randn(2048, 512, dtype=torch.bfloat16, device=device)
    extras = _extras(model, 2048, split, device)
    got, _ = step(model, x, extras, recipe)
    assert _fused(model)
    want = step(_unfused(model), x, extras, recipe)[0]
    if model[1].scaled:
        # Index 2 is the probs' gradient: float32 row sums of the row-amax kernel variant,
        # which on the GPU round differently from the plain kernel's (test_gated_activation).
        assert_same_row_sums(got.pop(2), want.pop(2), f"{gate}: probs grad")
    assert_same(got, want, gate)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", PER_TENSOR, ids=IDS)
def test_no_host_sync_on_cuda(recipe):
    device = cuda_or_skip()
    model = _model("swiglu-scaled", dtype=torch.bfloat16, device=device)
    x = torch.randn(256, 64, dtype=torch.bfloat16, device=device)
    extras = _extras(model, 256, torch.tensor([100, 0, 156], device=device), device)
    step(model, x, extras, recipe)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(model, x, extras, recipe)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert _fused(model)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", PER_TENSOR, ids=IDS)
def test_dense_on_cuda_bitwise_the_unfused_ops(recipe):
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(512, 768, bias=True), ops.SwiGLU(), ops.Linear(384, 512)).to(
        device=device, dtype=torch.bfloat16)
    x = torch.randn(4, 300, 512, dtype=torch.bfloat16, device=device)
    got, _ = step(model, x, [], recipe)
    assert _fused(model)
    assert_same(got, step(_unfused(model), x, [], recipe)[0], "dense")
