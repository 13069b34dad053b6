"""The expert MLP under a recipe: FC1's quantized GEMM applies the activation and emits FC2's
quantized input. The plan shows it under a recipe only; outputs, gradients and saved state are
the unfused ops' (bit for bit on the torch reference path, also with offloading; within the
unfused ops' own error through the Triton kernels); on CUDA no host sync, and CUDA-graph
capture with device split sizes."""

import copy

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.fusions.forward_quantized_grouped_mlp import ForwardQuantizedGroupedMLP
from fuseops.fusions.fusion import PlanConfig
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.quant import recipes
from tests.fusions.test_producer_quantize_linear import assert_same, step
from tests.helpers import REL_TOL, capture_cuda_graph, rel_err

# The formats it applies under; FP8 on tensor cores declines (the module's docstring).
RECIPES = [recipes.MXFP8(), recipes.NVFP4()]
IDS = [type(r).__name__ for r in RECIPES]
FP8 = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise()]
SPLIT = [20, 0, 44]
FUSED = [("ForwardQuantizedGroupedMLP", (0, 1, 2))]
# Every activation kind the expert MLP takes: plain, gated, interleaved, clamped, scaled.
GATES = {
    "gelu": lambda: ops.GELU(approximate="tanh"),
    "swiglu-scaled": lambda: ops.SwiGLU(scaled=True),
    "geglu-interleaved": lambda: ops.GeGLU(interleaved=True),
    "clamped-interleaved-scaled": lambda: ops.ClampedSwiGLU(limit=1.5, interleaved=True, scaled=True),
}


def _model(gate, *, dtype=torch.float32, device="cpu", groups=3, hidden=64, ffn=48):
    torch.manual_seed(0)
    act = GATES[gate]()
    fc1_out = ffn if gate == "gelu" else 2 * ffn
    model = fuseops.Sequential(
        ops.GroupedLinear(groups, hidden, fc1_out, bias=True), act, ops.GroupedLinear(groups, ffn, hidden, bias=True)
    )
    return model.to(device=device, dtype=dtype)


def _extras(model, split, rows, device="cpu"):
    probs = [torch.rand(rows, device=device)] if getattr(model[1], "scaled", False) else []
    return [split, *probs, split]


def _unfused(model):
    unfused = copy.deepcopy(model)
    unfused.fuse = False
    return unfused


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_plan_shows_the_fusion_under_a_recipe_only(recipe):
    for gate in GATES:
        model = _model(gate)
        x, extras = torch.randn(64, 64), _extras(model, SPLIT, 64)
        step(model, x, extras, recipe)
        assert model.plan.forward == FUSED, gate
        assert ("GroupedMLP", (0, 1, 2), "quantized recipes run the ops' quantized GEMMs") in model.plan.declined
        # The saved state is the basic ops' own: their backward runs, or (gated) the backward
        # fusions that read only their records.
        basic = [("GroupedLinear", (0,)), (type(model[1]).__name__, (1,)), ("GroupedLinear", (2,))]
        amax = [("BackwardGatedAmaxLinear", (0, 1)), ("GroupedLinear", (2,))]
        assert model.plan.backward in (basic, amax, [("BackwardQuantizedGatedMLP", (0, 1, 2))]), gate
        step(model, x, extras, recipe, grad=False)
        assert model.plan.forward == FUSED, f"{gate} without grad"
        step(model, x, extras, None)
        assert model.plan.forward == [("GroupedMLP", (0, 1, 2))], f"{gate} without a recipe"


@pytest.mark.parametrize("recipe", FP8, ids=[type(r).__name__ for r in FP8])
def test_declines_fp8_on_tensor_cores(recipe):
    model = _model("swiglu-scaled")
    x, extras = torch.randn(64, 64), _extras(model, SPLIT, 64)
    step(model, x, extras, recipe)
    assert model.plan.forward == [("GroupedLinear", (0,)), ("ForwardActivationQuantizeLinear", (1, 2))]
    reason = "FP8 on tensor cores: the unfused FC1 and activation kernels measured faster"
    assert ("ForwardQuantizedGroupedMLP", (0, 1, 2), reason) in model.plan.declined


def test_applies_on_cuda_at_every_shape_and_dtype():
    """No device-specific guard: the kernel's masked-pointer path (odd widths, float32) and a
    one-column h are exact on CUDA too (tests/kernels/gemm/test_grouped_scaled_act.py's
    gpu tests)."""
    fusion = ForwardQuantizedGroupedMLP()
    for hidden, ffn, dtype in [(64, 48, torch.bfloat16), (64, 48, torch.float32), (2, 1, torch.float32),
                               (2, 8, torch.bfloat16), (64, 4, torch.float16)]:
        model = _model("swiglu-scaled", hidden=hidden, ffn=ffn)
        extras = [(SPLIT,), (None,), (SPLIT,)]
        for device_type in ("cuda", "cpu"):
            cfg = PlanConfig(recipes.MXFP8(), dtype, device_type, True, True, True)
            assert fusion.guard(list(model), cfg, extras) is None, (hidden, ffn, dtype, device_type)


def test_same_guards_as_the_grouped_mlp():
    recipe = recipes.MXFP8()
    model = _model("swiglu-scaled")
    x, probs = torch.randn(64, 64), torch.rand(64)
    step(model, x, [SPLIT, probs, [0, 64, 0]], recipe)
    assert model.plan.forward == [("GroupedLinear", (0,)), ("ForwardActivationQuantizeLinear", (1, 2))]
    assert ("ForwardQuantizedGroupedMLP", (0, 1, 2), "the two GroupedLinears get different split sizes") in (
        model.plan.declined)
    model = fuseops.Sequential(ops.GroupedLinear(3, 64, 96), ops.SwiGLU(), ops.GroupedLinear(2, 48, 64))
    step(model, x, [SPLIT, [20, 44]], recipe)
    assert ("ForwardQuantizedGroupedMLP", (0, 1, 2), "the two GroupedLinears have different group counts") in (
        model.plan.declined)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_bitwise_the_unfused_ops(recipe, dtype):
    """The torch references: bit for bit, with and without grads, and with FC2's weight, then
    FC1's parameters too, frozen (FC2 then saves no column-wise copy of its input)."""
    for gate in GATES:
        model = _model(gate, dtype=dtype)
        unfused = _unfused(model)
        x, extras = torch.randn(64, 64, dtype=dtype), _extras(model, SPLIT, 64)
        for grad in (True, False):
            got, _ = step(model, x, extras, recipe, grad=grad)
            assert model.plan.forward == FUSED
            assert_same(got, step(unfused, x, extras, recipe, grad=grad)[0], f"{gate} grad={grad}")
        for frozen in (model[2].weight, model[0].weight, model[0].bias):
            frozen.requires_grad_(False)
            unfused.get_parameter(next(n for n, p in model.named_parameters() if p is frozen)).requires_grad_(False)
            got, _ = step(model, x, extras, recipe)
            assert_same(got, step(unfused, x, extras, recipe)[0], f"{gate} frozen")


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_offloaded_state_is_the_unfused_ops_and_gradients_bitwise(recipe):
    for gate in ("gelu", "clamped-interleaved-scaled"):
        model = _model(gate)
        unfused = _unfused(model)
        x, extras = torch.randn(64, 64), _extras(model, SPLIT, 64)
        want, want_handle = step(unfused, x, extras, recipe, offload=True)
        got, handle = step(model, x, extras, recipe, offload=True)
        assert_same(got, want, f"{gate} offloaded, against unfused")
        # The same typed records: the same buffers go to the host (z and both column-wise
        # copies). FC1's and FC2's inputs share one int64 [G + 1] offsets tensor here (the
        # unfused GroupedLinears each make their own): its bytes move once.
        stats, want_stats = handle.stats, want_handle.stats
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"] > 0
        assert stats["bytes_offloaded"] == want_stats["bytes_offloaded"] - 8 * (len(SPLIT) + 1)
        assert stats["tensors_offloaded"] == want_stats["tensors_offloaded"]


def _close_to_float64(model, x, extras, recipe, device):
    """Fused within its dtype's tolerance of float64, or no worse than twice the unfused error
    (the FC1 GEMMs sum in other orders; quantization can turn that into a code step)."""
    got, _ = step(model, x, extras, recipe)
    want, _ = step(_unfused(model), x, extras, recipe)
    exact = _unfused(model).to(device="cpu", dtype=torch.float64)
    exact_extras = [(e.double() if e.is_floating_point() else e).cpu() if isinstance(e, torch.Tensor) else e
                    for e in extras]
    ref, _ = step(exact, x.double().cpu(), exact_extras, None)
    for i, (a, b, c) in enumerate(zip(got, want, ref)):
        err, base = rel_err(a, c.to(a.device)), rel_err(b, c.to(b.device))
        assert err <= max(2 * base, REL_TOL[x.dtype]), f"output/grad {i}: {err:.2e} (unfused {base:.2e})"
    assert model.plan.forward == FUSED


@pytest.mark.skipif(not INTERPRET, reason="the interpreter runs only on CPU-only machines")
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_through_triton_kernels(recipe):
    """The fused kernel and the basic ops' kernels, interpreted; split sizes as a tensor, with
    an empty group and one group holding every row."""
    for gate, split, dtype in [("swiglu-scaled", SPLIT, torch.bfloat16), ("gelu", [0, 64, 0], torch.float32),
                               ("clamped-interleaved-scaled", [0, 0, 64], torch.float32)]:
        model = _model(gate, dtype=dtype)
        x, extras = torch.randn(64, 64, dtype=dtype), _extras(model, torch.tensor(split), 64)
        with interpreted_kernels():
            _close_to_float64(model, x, extras, recipe, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_on_cuda(recipe, gate):
    model = _model(gate, dtype=torch.bfloat16, device="cuda", groups=4, hidden=512, ffn=384)
    split = torch.tensor([700, 0, 1300, 48], device="cuda")
    x = torch.randn(2048, 512, dtype=torch.bfloat16, device="cuda")
    _close_to_float64(model, x, _extras(model, split, 2048, "cuda"), recipe, "cuda")


def _cuda_case(gate, sizes):
    """A bf16 model on CUDA, its input and extra inputs (split sizes as a device tensor)."""
    model = _model(gate, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(sum(sizes), 64, dtype=torch.bfloat16, device="cuda")
    return model, x, _extras(model, torch.tensor(sizes, device="cuda"), sum(sizes), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_no_host_sync_on_cuda(recipe):
    model, x, extras = _cuda_case("swiglu-scaled", [100, 0, 156])
    step(model, x, extras, recipe)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(model, x, extras, recipe)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert model.plan.forward == FUSED


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_captures_in_a_cuda_graph(recipe):
    model, x, extras = _cuda_case("clamped-interleaved-scaled", [64, 64, 128])
    split = extras[0]
    graph, static = capture_cuda_graph(lambda: step(model, x, extras, recipe)[0])
    for sizes in ([10, 200, 46], [0, 256, 0]):
        split.copy_(torch.tensor(sizes))
        graph.replay()
        torch.cuda.synchronize()
        captured = [t.clone() for t in static]
        for a, b in zip(captured, step(model, x, extras, recipe)[0]):
            torch.testing.assert_close(a, b)
    assert model.plan.forward == FUSED
