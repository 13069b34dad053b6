"""Linear and GroupedLinear under each recipe: signal-to-quantization-noise ratio of the
output, input gradient and weight gradient against float64 (DESIGN.md floors)."""

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.quant import recipes
from tests.helpers import sqnr_db
from tests.ops.harness import devices

# (recipe, output dB, input-grad dB, weight-grad dB)
FLOORS = [
    (recipes.FP8CurrentScaling(), 27.0, 23.0, 21.0),
    (recipes.FP8Blockwise(), 27.0, 23.0, 21.0),
    (recipes.MXFP8(), 26.5, 23.0, 21.0),
    (recipes.NVFP4(), 14.0, 12.0, 12.0),
]
IDS = [type(r).__name__ for r, *_ in FLOORS]


def _run(model, x, extras, dy, recipe):
    x = x.detach().clone().requires_grad_()
    with fuseops.autocast(recipe=recipe):
        y = model(x, *extras)
    y.backward(dy)
    return y.detach(), x.grad, model[0].weight.grad


def _check(model, x, extras, recipe, floors):
    dy = torch.randn(*x.shape[:-1], model[0].out_features, device=x.device, dtype=x.dtype)
    y, dx, dw = _run(model, x, extras, dy, recipe)
    w64 = model[0].weight.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y64 = _reference(model[0], x64, w64, extras)
    y64.backward(dy.double())
    for what, got, ref, floor in (("output", y, y64, floors[0]), ("input grad", dx, x64.grad, floors[1]),
                                  ("weight grad", dw, w64.grad, floors[2])):
        db = sqnr_db(got, ref.detach())
        assert db >= floor, f"{type(recipe).__name__} {what}: {db:.1f} dB < {floor} dB"


def _reference(op, x64, w64, extras):
    if isinstance(op, ops.GroupedLinear):
        outs, start = [], 0
        for g, n in enumerate(extras[0]):
            outs.append(x64[start : start + n] @ w64[g].T)
            start += n
        return torch.cat(outs)
    return x64 @ w64.T


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("recipe, floors", [(r, f) for r, *f in FLOORS], ids=IDS)
def test_grouped_linear_sqnr(device, recipe, floors):
    model = fuseops.Sequential(ops.GroupedLinear(3, 256, 128, device=device))
    x = torch.randn(384, 256, device=device)
    _check(model, x, [[128, 0, 256]], recipe, floors)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("recipe, floors", [(r, f) for r, *f in FLOORS], ids=IDS)
def test_linear_sqnr(device, recipe, floors):
    model = fuseops.Sequential(ops.Linear(256, 128, bias=False, device=device))
    x = torch.randn(4, 96, 256, device=device)
    _check(model, x, [], recipe, floors)


@pytest.mark.skipif(not INTERPRET, reason="interpreter only on CPU machines")
@pytest.mark.parametrize("recipe, floors", [(r, f) for r, *f in FLOORS], ids=IDS)
def test_linear_sqnr_through_triton_kernels(recipe, floors):
    model = fuseops.Sequential(ops.Linear(64, 48, bias=False))
    with interpreted_kernels():
        _check(model, torch.randn(80, 64), [], recipe, floors)


@pytest.mark.skipif(not INTERPRET, reason="interpreter only on CPU machines")
@pytest.mark.parametrize("recipe, floors", [(r, f) for r, *f in FLOORS], ids=IDS)
def test_grouped_linear_sqnr_through_triton_kernels(recipe, floors):
    model = fuseops.Sequential(ops.GroupedLinear(2, 64, 32))
    with interpreted_kernels():
        _check(model, torch.randn(96, 64), [[32, 64]], recipe, floors)


@pytest.mark.parametrize("recipe", [r for r, *_ in FLOORS], ids=IDS)
def test_plan_declines_fused_mlp_under_recipes(recipe):
    model = fuseops.Sequential(ops.GroupedLinear(2, 64, 64), ops.SwiGLU(), ops.GroupedLinear(2, 32, 64))
    with fuseops.autocast(recipe=recipe):
        model(torch.randn(64, 64), [32, 32], [32, 32])
    # Its bf16 GEMMs step aside; the quantized expert MLP's forward runs instead where it
    # pays (emulated formats), else the activation emits FC2's quantized input.
    if type(recipe).__name__ in ("MXFP8", "NVFP4"):
        assert model.plan.forward == [("ForwardQuantizedGroupedMLP", (0, 1, 2))]
    else:
        assert model.plan.forward == [("GroupedLinear", (0,)), ("ForwardActivationQuantizeLinear", (1, 2))]
    assert any(d[0] == "GroupedMLP" for d in model.plan.declined)


@pytest.mark.parametrize("recipe", [r for r, *_ in FLOORS], ids=IDS)
@pytest.mark.parametrize("device", devices())
def test_dense_and_grouped_mlps_train_under_every_recipe(recipe, device):
    """API.md's two examples, a few SGD steps: the loss falls and stays finite."""
    torch.manual_seed(0)
    dense = fuseops.Sequential(ops.RMSNorm(64), ops.Linear(64, 128), ops.GELU(approximate="tanh"), ops.Linear(128, 64))
    experts = fuseops.Sequential(ops.GroupedLinear(4, 64, 2 * 48), ops.SwiGLU(), ops.GroupedLinear(4, 48, 64))
    split = torch.tensor([32, 0, 64, 32], device=device)
    for model, extras in ((dense.to(device), []), (experts.to(device), [split, split])):
        x, target = torch.randn(128, 64, device=device), torch.randn(128, 64, device=device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for _ in range(6):
            with fuseops.autocast(recipe=recipe):
                loss = torch.nn.functional.mse_loss(model(x, *extras), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert all(map(torch.isfinite, map(torch.tensor, losses)))
        assert losses[-1] < losses[0], f"{type(recipe).__name__}: {losses}"


def test_quantize_op_rounds_to_the_recipe_format_and_is_identity_without_one():
    x = torch.randn(8, 64)
    model = fuseops.Sequential(ops.Quantize())
    torch.testing.assert_close(model(x), x)
    with fuseops.autocast(recipe=recipes.FP8CurrentScaling()):
        y = model(x)
    assert not torch.equal(y, x)
    torch.testing.assert_close(y, fuseops.quantize(x, recipes.FP8CurrentScaling()).dequantize(x.dtype))


def test_quantize_op_backward_casts_the_gradient():
    x = torch.randn(8, 64, requires_grad=True)
    dy = torch.randn(8, 64)
    with fuseops.autocast(recipe=recipes.FP8CurrentScaling()):
        y = fuseops.Sequential(ops.Quantize(forward=False, backward=True))(x)
    y.backward(dy)
    expected = fuseops.quantize(dy, recipes.FP8CurrentScaling(), role="grad").dequantize(dy.dtype)
    torch.testing.assert_close(x.grad, expected)


@pytest.mark.parametrize("recipe", [r for r, *_ in FLOORS], ids=IDS)
def test_an_op_called_directly_runs_under_the_recipe_in_effect(recipe):
    """A lone op runs as a one-op Sequential would: quantized under autocast, bit for bit."""
    torch.manual_seed(0)
    linear = ops.Linear(64, 32)
    x = torch.randn(8, 64)
    with fuseops.autocast(recipe=recipe):
        direct = linear(x)
        wrapped = fuseops.Sequential(linear)(x)
    assert torch.equal(direct, wrapped)
    assert not torch.equal(direct, linear(x))
