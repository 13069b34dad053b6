"""fuseops.moe.expert_layer under a recipe (fuseops/moe/expert_layer_quantized.py): its quantized
Function equals the composition permute -> experts -> unpermute under the same recipe bit for bit
(output and every gradient, torch references and Triton kernels alike, each of the four recipes),
including empty experts, zero tokens, non-finite inputs, partial gradients, saved-tensor hooks and
weight changes between steps; it stays within FP8's noise of a float64 reference; lean and float64
fall back and say why."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.gemm import grouped_scaled_act
from fuseops.kernels.quantization.formats import Scaling
from fuseops.moe import expert_layer, expert_layer_fallback, permute, unpermute
from fuseops.quant import weight_cache
from tests.helpers import assert_bitwise, assert_replay_equals_eager, cuda_or_skip, reroutable, sqnr_db
from tests.moe.test_expert_layer import routing

RECIPES = {"fp8_current": fuseops.recipes.FP8CurrentScaling, "fp8_blockwise": fuseops.recipes.FP8Blockwise,
           "mxfp8": fuseops.recipes.MXFP8, "nvfp4": fuseops.recipes.NVFP4}
FP8 = {name: RECIPES[name] for name in ("fp8_current", "fp8_blockwise")}
GATES = {
    "swiglu": lambda: ops.SwiGLU(scaled=True),
    "geglu-interleaved": lambda: ops.GeGLU(approximate="tanh", interleaved=True, scaled=True),
    "clamped": lambda: ops.ClampedSwiGLU(limit=3.0, scaled=True),
}
E, H, F = 4, 64, 32


def make_experts(gate="swiglu", bias=True, dtype=torch.bfloat16, device="cpu"):
    torch.manual_seed(1)
    experts = fuseops.Sequential(ops.GroupedLinear(E, H, 2 * F, bias=bias), GATES[gate](), ops.GroupedLinear(E, F, H))
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    return experts.to(device=device, dtype=dtype)


def composition(x, ids, w, experts):
    """What expert_layer computes, op by op: the scaled gate takes the weights as its probs."""
    x_sorted, split_sizes, row_map = permute(x, ids, E)
    probs = (w if w is not None else x.new_ones(ids.shape)).reshape(-1)
    probs = probs.new_empty(row_map.numel()).scatter(0, row_map.reshape(-1), probs)
    return unpermute(experts(x_sorted, split_sizes, probs, split_sizes), row_map, None)


def step(layer, experts, x, ids, w, dy, needs=("x", "w", "params")):
    """Output and the gradients asked for in ``needs`` of one forward+backward."""
    x = x.detach().clone().requires_grad_("x" in needs)
    w = w.detach().clone().requires_grad_("w" in needs) if w is not None else None
    params = list(experts.parameters())
    for p in params:
        p.requires_grad_("params" in needs)
    y = layer(x, ids, w, experts)
    inputs = [t for t in (x, w, *params) if t is not None and t.requires_grad]
    return [y.detach(), *torch.autograd.grad(y, inputs, dy)]


def assert_all_bitwise(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_bitwise(a, b, f"tensor {i}")


def paths():
    kernels = [pytest.param(True, id="kernels", marks=pytest.mark.skipif(not INTERPRET, reason="interpreter"))]
    return [pytest.param(False, id="reference"), *kernels]


def kernels_or_not(kernels: bool):
    return interpreted_kernels() if kernels else contextlib.nullcontext()


def compare(recipe, kernels, *, gate="swiglu", bias=True, T=9, K=2, weights=True, empty=(), needs=("x", "w", "params"),
            x_fill=None, dtype=torch.bfloat16, weights_dtype=torch.float32):
    experts = make_experts(gate, bias, dtype)
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, H, generator=g).to(dtype)
    if x_fill is not None:
        x[T // 2, 3] = x_fill
    ids = routing(T, E, K, T, empty=empty)
    w = torch.rand(T, K, generator=g).to(weights_dtype) if weights else None
    dy = torch.randn(T, H, generator=g).to(dtype)
    with kernels_or_not(kernels), fuseops.autocast(recipe=RECIPES[recipe]()):
        assert expert_layer_fallback(x, ids, w, experts) is None
        got = step(expert_layer, experts, x, ids, w, dy, needs)
        want = step(composition, experts, x, ids, w, dy, needs)
    assert_all_bitwise(got, want)
    return got


@pytest.mark.parametrize("kernels", paths())
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("gate", GATES)
def test_equals_the_composition_bit_for_bit(recipe, gate, kernels):
    compare(recipe, kernels, gate=gate, bias=gate != "clamped")


@pytest.mark.parametrize("kernels", paths())
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("needs", [("x",), ("w",), ("params",), ("x", "w")], ids="-".join)
def test_partial_gradients_equal_the_composition(recipe, needs, kernels):
    compare(recipe, kernels, needs=needs)


@pytest.mark.parametrize("kernels", paths())
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_fc1_epilogue_choice_is_shared_with_the_composition(recipe, kernels, monkeypatch):
    """The other FC1 forward of each format (``grouped_scaled_act.UNFUSED_FASTER`` flipped): the
    layer and the composition still agree bit for bit (the benchmark's A/B of that choice)."""
    flipped = tuple(s for s in Scaling if s not in grouped_scaled_act.UNFUSED_FASTER)
    monkeypatch.setattr(grouped_scaled_act, "UNFUSED_FASTER", flipped)
    compare(recipe, kernels)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("case", ["empty-experts", "zero-tokens", "one-token-every-expert", "no-weights",
                                  "weights-in-x-dtype", "float32", "float16"])
def test_edge_cases_equal_the_composition(recipe, case):
    kw = {"empty-experts": dict(empty=(0, 2)), "zero-tokens": dict(T=0), "one-token-every-expert": dict(T=1, K=E),
          "no-weights": dict(weights=False), "weights-in-x-dtype": dict(weights_dtype=torch.bfloat16),
          "float32": dict(dtype=torch.float32), "float16": dict(dtype=torch.float16)}[case]
    compare(recipe, False, **kw)


@pytest.mark.parametrize("recipe", RECIPES)
def test_inference_keeps_nothing_and_equals_the_composition(recipe):
    experts = make_experts()
    x, ids, w = torch.randn(9, H).bfloat16(), routing(9, E, 2, 0), torch.rand(9, 2)
    with fuseops.autocast(recipe=RECIPES[recipe]()):
        with torch.no_grad():
            y = expert_layer(x, ids, w, experts)
        assert y.grad_fn is None
        torch.testing.assert_close(y, composition(x, ids, w, experts).detach(), rtol=0, atol=0)


@pytest.mark.parametrize("kernels", paths())
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_input_stays_where_the_composition_puts_it(recipe, value, kernels):
    y = compare(recipe, kernels, x_fill=value)[0]
    # The other tokens' outputs are finite: a NaN or an inf does not spread through the groups'
    # scales. The poisoned token's output is not finite, where it can be seen: the interpreter's
    # float8 -> float32 upcast decodes NaN codes as numbers (tests/ops/test_quantized_non_finite.py),
    # so through the kernels on CPU only its bits against the composition's are checked (the GPU
    # test checks the rest).
    assert torch.isfinite(y[torch.arange(y.shape[0]) != 4]).all()
    if not kernels:
        assert not torch.isfinite(y[4]).all()


@pytest.mark.parametrize("recipe", FP8)
def test_close_to_float64(recipe):
    """Within FP8's noise of the float64 layer (float64 copies of the bf16 parameters): the
    forward through two FP8 GEMMs, the gradients through E5M2 (current scaling) or 1x128-block
    E4M3 (blockwise) ones."""
    experts = make_experts(dtype=torch.bfloat16)
    exact = fuseops.Sequential(*list(copy.deepcopy(experts).to(torch.float64)), fuse=False)
    T, K = 64, 2
    g = torch.Generator().manual_seed(0)
    x, w, dy = torch.randn(T, H, generator=g), torch.rand(T, K, generator=g), torch.randn(T, H, generator=g)
    ids = routing(T, E, K, 0)
    with fuseops.autocast(recipe=RECIPES[recipe]()):
        got = step(expert_layer, experts, x.bfloat16(), ids, w, dy.bfloat16())
    want = step(composition, exact, x.double(), ids, w.double(), dy.double())
    # One quantized Linear's floors (DESIGN.md: 27 / 23 / 21 dB) less the second GEMM's noise:
    # measured 23.6-23.8 dB for y, 20.5-23.4 for the gradients, both recipes.
    floors = {"y": 22, "dx": 19, "dweights": 19, "dw1": 19, "db1": 19, "dw2": 19}
    for name, a, b in zip(floors, got, want, strict=True):
        assert sqnr_db(a, b) > floors[name], (name, sqnr_db(a, b))


@pytest.mark.parametrize("recipe", RECIPES)
def test_saved_tensor_hooks_see_the_saved_copies_and_keep_gradients_exact(recipe):
    experts = make_experts()
    x, ids, w, dy = torch.randn(9, H).bfloat16(), routing(9, E, 2, 0), torch.rand(9, 2), torch.randn(9, H).bfloat16()
    packed = []

    def pack(t):
        packed.append(t.dtype)
        return t.clone()

    with fuseops.autocast(recipe=RECIPES[recipe]()):
        want = step(expert_layer, experts, x, ids, w, dy)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            got = step(expert_layer, experts, x, ids, w, dy)
    assert_all_bitwise(got, want)
    # FC1's and FC2's inputs are saved as their FP8 column-wise copies.
    assert torch.float8_e4m3fn in packed


@pytest.mark.parametrize("recipe", RECIPES)
def test_weights_quantized_once_per_version_and_never_stale(recipe):
    """Micro-batches reuse the cached quantized weights; after an optimizer step and after
    ``param.data`` replacement the layer equals one run with ``cache_weights=False``."""
    experts = make_experts()
    x, ids, w, dy = torch.randn(9, H).bfloat16(), routing(9, E, 2, 0), torch.rand(9, 2), torch.randn(9, H).bfloat16()
    weight_cache.clear()
    cached, uncached = RECIPES[recipe](), RECIPES[recipe](cache_weights=False)
    with fuseops.autocast(recipe=cached):
        step(expert_layer, experts, x, ids, w, dy)
    held = weight_cache.cached_bytes()
    assert held > 0
    opt = torch.optim.SGD(experts.parameters(), lr=0.5)
    for change in ("micro-batch", "optimizer-step", "param.data"):
        if change == "optimizer-step":
            for p in experts.parameters():
                p.grad = torch.randn_like(p)
            opt.step()
        elif change == "param.data":
            experts[0].weight.data = experts[0].weight.data * 2
        with fuseops.autocast(recipe=cached):
            got = step(expert_layer, experts, x, ids, w, dy)
        with fuseops.autocast(recipe=uncached):
            want = step(expert_layer, experts, x, ids, w, dy)
        assert_all_bitwise(got, want)
    assert weight_cache.cached_bytes() == held


@pytest.mark.parametrize("kernels", paths())
@pytest.mark.parametrize("recipe", RECIPES)
def test_weight_gradients_into_main_grad_equal_the_composition(recipe, kernels):
    with kernels_or_not(kernels):
        check_main_grad(recipe, "cpu", 9)


def check_main_grad(recipe, device, T):
    """``accumulate_into_main_grad`` on both GroupedLinears: the quantized layer runs (no fallback)
    and adds each weight gradient to its ``main_grad`` as the composition's GroupedLinear does,
    bit for bit over two micro-batches; ``.grad`` stays None, the other gradients are the
    composition's bit for bit."""
    mine, theirs = make_experts(device=device), make_experts(device=device)
    for experts in (mine, theirs):
        for i in (0, 2):
            experts[i].accumulate_into_main_grad = True
            experts[i].weight.main_grad = torch.zeros(experts[i].weight.shape, device=device)
    g = torch.Generator().manual_seed(3)
    x, ids = torch.randn(T, H, generator=g).to(device, torch.bfloat16), routing(T, E, 2, 3, device=device)
    w = torch.rand(T, 2, generator=g).to(device)
    dy = torch.randn(T, H, generator=g).to(device, torch.bfloat16)

    def micro_batch(layer, experts):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        layer(xg, ids, wg, experts).backward(dy)
        return [xg.grad, wg.grad]

    with fuseops.autocast(recipe=RECIPES[recipe]()):
        assert expert_layer_fallback(x, ids, w, mine) is None
        for _ in range(2):
            assert_all_bitwise(micro_batch(expert_layer, mine), micro_batch(composition, theirs))
    for i in (0, 2):
        assert mine[i].weight.grad is None and theirs[i].weight.grad is None
        assert mine[i].weight.main_grad.abs().sum() > 0
        assert_bitwise(mine[i].weight.main_grad, theirs[i].weight.main_grad, f"FC{i // 2 + 1} main_grad")
    assert_bitwise(mine[0].bias.grad, theirs[0].bias.grad, "FC1 bias")


def test_lean_and_float64_fall_back_and_say_why():
    x, experts = torch.randn(4, H), make_experts(dtype=torch.float32)
    ids, w = routing(4, E, 2, 0), torch.rand(4, 2)
    with fuseops.autocast(recipe=fuseops.recipes.FP8CurrentScaling()):
        assert "lean under a recipe" in expert_layer_fallback(x, ids, None, experts, lean=True)
        assert expert_layer_fallback(x, ids, None, experts) is None
        assert "float64" in expert_layer_fallback(x.double(), ids, None, make_experts(dtype=torch.float64))
        # The fallback still computes the layer.
        got = expert_layer(x, ids, w, experts, lean=True)
        want = composition(x, ids, w, experts)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("recipe", RECIPES)
def test_fullgraph_compile_equals_eager_over_three_token_counts(recipe):
    """One graph for the first count, a dynamic one from the second on (no recompile for the
    third), training, bit for bit eager (aot_eager; inductor on CPU compiles C++, run by hand:
    equal within float32 rounding of the weights' gradient)."""
    torch._dynamo.reset()
    experts = make_experts()

    def layer(x, ids, w):
        with fuseops.autocast(recipe=RECIPES[recipe]()):
            return expert_layer(x, ids, w, experts)

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    counters = torch._dynamo.utils.counters
    counters.clear()
    for T in (9, 13, 17):
        g = torch.Generator().manual_seed(T)
        x, w, dy = torch.randn(T, H, generator=g).bfloat16(), torch.rand(T, 2, generator=g), torch.randn(T, H).bfloat16()
        ids = routing(T, E, 2, T)
        got = step(lambda x, i, w, _: compiled(x, i, w), experts, x, ids, w, dy)
        assert_all_bitwise(got, step(lambda x, i, w, _: layer(x, i, w), experts, x, ids, w, dy))
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", FP8)
def test_gpu_weight_gradients_into_main_grad_equal_the_composition(recipe):
    """``check_main_grad`` on the GPU's quantized wgrads (the dispatch table's, each adding into
    main_grad): 256 tokens top-2 over the 4 experts."""
    check_main_grad(recipe, cuda_or_skip(), 256)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_gpu_equals_the_composition_without_a_host_sync(recipe):
    cuda_or_skip()
    experts = make_experts(device="cuda")
    T, K = 300, 4
    g = torch.Generator().manual_seed(0)
    x, w, dy = torch.randn(T, H, generator=g), torch.rand(T, K, generator=g), torch.randn(T, H, generator=g)
    x, w, dy, ids = x.cuda().bfloat16(), w.cuda(), dy.cuda().bfloat16(), routing(T, E, K, 0, "cuda", empty=(1,))
    with fuseops.autocast(recipe=RECIPES[recipe]()):
        want = step(composition, experts, x, ids, w, dy)
        step(expert_layer, experts, x, ids, w, dy)  # the weight cache filled
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = step(expert_layer, experts, x, ids, w, dy)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert_all_bitwise(got, want)
        x[7, 5] = float("nan")
        y = step(expert_layer, experts, x, ids, w, dy)[0]
        assert_all_bitwise([y], step(composition, experts, x, ids, w, dy)[:1])
    assert not torch.isfinite(y[7]).all() and torch.isfinite(y[torch.arange(T, device="cuda") != 7]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES)
def test_gpu_captures_in_cuda_graph(recipe):
    """A forward+backward step captured, then replayed on other routing and inputs written into
    the static tensors: the eager step's outputs and gradients (the weight quantize runs inside
    the graph: nothing is cached while capturing)."""
    cuda_or_skip()
    experts = make_experts(device="cuda")
    T, K = 200, 2
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ids, w, route = reroutable(T, E, K, "cuda")
    dy = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
    leaves = [x, w, *experts.parameters()]

    def run():
        for t in leaves:
            t.grad = None
        with fuseops.autocast(recipe=RECIPES[recipe]()):
            y = expert_layer(x, ids, w, experts)
        y.backward(dy)
        return y

    assert_replay_equals_eager(run, route, leaves)
