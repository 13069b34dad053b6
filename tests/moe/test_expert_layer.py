"""fuseops.moe.expert_layer in both modes equals the composition permute -> experts(fuse=False)
-> unpermute within the dtype's rounding (outputs and every gradient, against float64), on
generated shapes, dtypes, activations, top-k, routings with empty experts and zero tokens;
keeps what its mode promises; propagates non-finite values; rejects bad input; no host sync and
CUDA-graph capture on the GPU."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.moe import expert_layer, expert_layer_fallback
from fuseops.moe import memory_model as mm
from tests.helpers import REL_TOL, assert_replay_equals_eager, cuda_or_skip, nudged, rel_err, reroutable

GATES = {
    "swiglu": lambda: ops.SwiGLU(),
    "swiglu-scaled": lambda: ops.SwiGLU(scaled=True),
    "swiglu-interleaved": lambda: ops.SwiGLU(interleaved=True),
    "geglu": lambda: ops.GeGLU(approximate="tanh"),
    "clamped": lambda: ops.ClampedSwiGLU(limit=3.0),
}


def make_experts(E, H, F, gate="swiglu", bias=False, dtype=torch.float32, device="cpu"):
    torch.manual_seed(1)
    experts = fuseops.Sequential(
        ops.GroupedLinear(E, H, 2 * F, bias=bias), GATES[gate](), ops.GroupedLinear(E, F, H)
    )
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    return experts.to(device=device, dtype=dtype)


def unfused(experts, dtype=None):
    """The same ops with fusion off (sharing parameters), or float64 copies of them."""
    if dtype is None:
        return fuseops.Sequential(*list(experts), fuse=False)
    return fuseops.Sequential(*list(copy.deepcopy(experts).to(dtype)), fuse=False)


def step(experts, x, ids, weights, dy, lean=False, **backward):
    """Output and gradients (x, weights, then the parameters) of one forward+backward."""
    x = x.detach().clone().requires_grad_()
    w = weights.detach().clone().requires_grad_() if weights is not None else None
    for p in experts.parameters():
        p.grad = None
    y = expert_layer(x, ids, w, experts, lean=lean)
    y.backward(dy, **backward)
    grads = [x.grad] + ([w.grad] if w is not None else []) + [p.grad for p in experts.parameters()]
    return [y.detach()] + [g.clone() for g in grads]


def routing(T, E, K, seed, device="cpu", empty=()):
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([e for e in range(E) if e not in empty] or [0])
    ids = allowed[torch.randint(0, len(allowed), (T, K), generator=g)]
    return ids.to(device)


def _errors(fused, plain, exact, what) -> dict[str, tuple[float, float]]:
    """Per result, the fused and the unfused error against float64 over the unfused result's
    finite values (none where it has none)."""
    errors = {}
    for name, f, u, e in zip(what, fused, plain, exact):
        finite = torch.isfinite(u)
        if f.numel() and finite.any():
            errors[name] = (rel_err(f[finite], e[finite]), rel_err(u[finite], e[finite]))
    return errors


def check_close(fused, plain, exact, dtype, what, nearby=None):
    """Fused within the dtype's tolerance of float64, or its worst error no worse than twice the
    unfused one's worst, over the example and, where given, its neighbours (``nearby``: name ->
    the two worst errors there, ``_errors_nearby``); non-finite values in the same places."""
    for name, f, u in zip(what, fused, plain):
        assert f.shape == u.shape, f"{name}: shape {tuple(f.shape)} != {tuple(u.shape)}"
        assert torch.equal(torch.isfinite(f), torch.isfinite(u)), f"{name}: non-finite values differ"
    for name, (err, base) in _errors(fused, plain, exact, what).items():
        near = (nearby or {}).get(name, (0.0, 0.0))
        err, base = max(err, near[0]), max(base, near[1])
        assert err <= max(2 * base, REL_TOL[dtype]), (
            f"{name}: {err:.2e} vs float64 (unfused {base:.2e}{', with the neighbours' if nearby else ''}, {dtype})")


def _errors_nearby(experts, x, ids, weights, dy, lean, kernels, what, draws=8):
    """Name -> the worst fused and the worst unfused error over ``draws`` neighbours of the
    example (``nudged``: x, the routing weights, dy and every parameter). At a token or two a
    result is a handful of roundings, and one example's errors are one draw of each path's spread
    (float16, one token through one expert twice: its routing-weight gradient 1.01e-3
    fused against 2.87e-4 unfused, the tolerance 1e-3; at twelve neighbours fused 3.2e-4 to
    1.3e-3, unfused 2.5e-4 to 3.5e-3); the worst of several draws compares the spreads."""
    g = torch.Generator().manual_seed(0)
    worst: dict[str, tuple[float, float]] = {}
    for _ in range(draws):
        moved = copy.deepcopy(experts)
        with torch.no_grad():
            for p in moved.parameters():
                p.copy_(nudged(p, x.dtype, g))
        xn, wn, dyn = (nudged(t, x.dtype, g) for t in (x, weights, dy))
        with kernels():
            fused = step(moved, xn, ids, wn, dyn, lean)
            plain = step(unfused(moved), xn, ids, wn, dyn)
        exact = step(unfused(moved, torch.float64), xn.double(), ids, wn.double() if wn is not None else None,
                     dyn.double())
        for name, (f, u) in _errors(fused, plain, exact, what).items():
            w = worst.get(name, (0.0, 0.0))
            worst[name] = (max(w[0], f), max(w[1], u))
    return worst


def _within(fused, plain, exact, dtype, what) -> bool:
    """Whether the example alone passes ``check_close``'s error rule."""
    return all(err <= max(2 * base, REL_TOL[dtype]) for err, base in _errors(fused, plain, exact, what).values())


def compare(E, T, H, F, K, dtype, gate, bias, weights_kind, lean, seed, kernels, empty=(), x_fill=None):
    experts = make_experts(E, H, F, gate, bias, dtype)
    assert expert_layer_fallback(torch.zeros(1, H, dtype=dtype), routing(1, E, K, seed), None, experts) is None
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    if x_fill is not None:
        x[x_fill[0], x_fill[1]] = x_fill[2]
    ids = routing(T, E, K, seed, empty=empty)
    weights = None if weights_kind is None else torch.rand(T, K, generator=g).to(weights_kind or dtype)
    dy = torch.randn(T, H, generator=g).to(dtype)
    with kernels():
        fused = step(experts, x, ids, weights, dy, lean)
        plain = step(unfused(experts), x, ids, weights, dy)
    exact = step(unfused(experts, torch.float64), x.double(), ids,
                 weights.double() if weights is not None else None, dy.double())
    names = ["y", "dx"] + (["dweights"] if weights is not None else []) + [n for n, _ in experts.named_parameters()]
    # The neighbours only where the example alone fails the rule.
    nearby = None if _within(fused, plain, exact, dtype, names) else _errors_nearby(
        experts, x, ids, weights, dy, lean, kernels, names)
    check_close(fused, plain, exact, dtype, names, nearby)
    return fused, plain


SHAPES = dict(E=st.integers(1, 5), T=st.sampled_from([0, 1, 3, 9]), H=st.sampled_from([8, 16, 24]),
              F=st.sampled_from([8, 12, 16]), K=st.integers(1, 3),
              dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
              gate=st.sampled_from(sorted(GATES)), bias=st.booleans(),
              weights_kind=st.sampled_from([None, torch.float32, False]), lean=st.booleans(),
              seed=st.integers(0, 2**16))


@given(**SHAPES)
def test_equals_the_composition_on_the_torch_references(**case):
    compare(**case, kernels=contextlib.nullcontext)


@pytest.mark.skipif(not INTERPRET, reason="Triton interpreter (CPU) only")
@settings(max_examples=6)
@given(**SHAPES)
def test_equals_the_composition_through_the_triton_kernels(**case):
    compare(**case, kernels=interpreted_kernels)


@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
@pytest.mark.parametrize("shape, plans", [((24, 2, 8, 8, 2), ((False, 1), (False, 1))),
                                          ((3, 1, 8, 16, 5), ((True, 1), (True, 1))),
                                          ((6, 2, 32, 4, 4), ((False, 4), (True, 1)))],
                         ids=["fc2-wgrad-first", "fc1-wgrad-first", "x-in-column-parts"])
def test_both_backward_orders(shape, plans, lean):
    """The plans memory_model picks (default's, lean's), each exercised: FC2's weight gradient
    first, or last after z is released (the default mode frees its saved tensors' storage
    then); the default's x_sorted for FC1's weight gradient whole, or made in column slices
    one at a time (lean makes none: its wgrad gathers)."""
    T, K, H, F, E = shape
    assert mm.backward_plan(mm.LayerShape(T, K, H, F, E, 4), lean) == plans[lean]
    kernels = interpreted_kernels if INTERPRET else contextlib.nullcontext
    compare(E, T, H, F, K, torch.float32, "swiglu", True, torch.float32, lean, 0, kernels)


@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_experts_without_tokens_and_zero_tokens(lean):
    # Experts 1 and 3 get no rows; then a batch of no tokens at all.
    compare(4, 6, 16, 8, 2, torch.float32, "swiglu", True, torch.float32, lean, 0, contextlib.nullcontext,
            empty=(1, 3))
    fused, _ = compare(4, 0, 16, 8, 2, torch.float32, "swiglu", True, torch.float32, lean, 0,
                       contextlib.nullcontext)
    assert fused[0].shape == (0, 16) and all((g == 0).all() for g in fused[3:])


@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_input_stays_where_the_composition_puts_it(lean, value):
    kernels = interpreted_kernels if INTERPRET else contextlib.nullcontext
    fused, _ = compare(3, 5, 16, 8, 2, torch.float32, "swiglu", False, torch.float32, lean, 3, kernels,
                       x_fill=(2, 5, value))
    y = fused[0]
    assert not torch.isfinite(y[2]).all() and torch.isfinite(y[[0, 1, 3, 4]]).all()


def test_repeatable_bit_for_bit():
    """Each mode gives the same bits every run. The two modes agree within float32's rounding, not
    bit for bit: lean recomputes FC1's pre-activation with the plain grouped GEMM, the default keeps
    the gated GEMM's, and the interpreter's float32 products (numpy's BLAS) may round by the column a
    value takes in the tile (seen on an AVX-512 CPU: the up half sits in columns F.. of the plain
    GEMM's tile, in columns 0.. of the gated GEMM's second accumulator)."""
    if not INTERPRET:
        pytest.skip("Triton interpreter (CPU) only")
    experts = make_experts(3, 16, 8, bias=True)
    x, ids, w, dy = torch.randn(7, 16), routing(7, 3, 2, 0), torch.rand(7, 2), torch.randn(7, 16)
    with interpreted_kernels():
        default, again, lean, lean_again = (step(experts, x, ids, w, dy, lean) for lean in (False, False, True, True))
    for a, b, c, d in zip(default, again, lean, lean_again, strict=True):
        assert torch.equal(a, b) and torch.equal(c, d)
        assert rel_err(c, a) <= REL_TOL[torch.float32]


@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_saves_what_its_mode_promises(lean):
    T, K, H, F = 6, 2, 16, 8
    experts = make_experts(3, H, F)
    x = torch.randn(T, H, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = expert_layer(x, routing(T, 3, K, 0), torch.rand(T, K, requires_grad=True), experts, lean=lean)
    params = {p.data_ptr() for p in experts.parameters()}
    activations = sorted(tuple(t.shape) for t in saved if t.data_ptr() not in params and t.is_floating_point())
    # probs in sorted order [T*K] and x itself always; the default z too, and no permuted copy of x.
    expected = [(T * K,), (T, H)] if lean else [(T * K,), (T, H), (T * K, 2 * F)]
    assert activations == sorted(expected)
    y.sum().backward()


def test_inference_under_no_grad_keeps_nothing():
    """Under torch.no_grad with parameters that require grad (inference), nothing is saved
    and no graph is built; the output is the composition's."""
    experts = make_experts(3, 16, 8)
    x, ids, w = torch.randn(6, 16, requires_grad=True), routing(6, 3, 2, 0), torch.rand(6, 2)
    saved = []
    with torch.no_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = expert_layer(x, ids, w, experts)
        x_sorted, split, row_map = fuseops.moe.permute(x, ids, 3)
        ref = fuseops.moe.unpermute(unfused(experts)(x_sorted, split, split), row_map, w)
    assert saved == [] and y.grad_fn is None
    torch.testing.assert_close(y, ref)


@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_retained_graph_and_saved_tensor_hooks_keep_gradients_exact(lean):
    """A retained graph (dz may not overwrite z, nothing is released) and hooks that copy what
    is saved (as offloading does) give the gradients of a plain backward."""
    experts = make_experts(3, 16, 8, bias=True)
    x, ids, w, dy = torch.randn(7, 16), routing(7, 3, 2, 0), torch.rand(7, 2), torch.randn(7, 16)
    ref = step(experts, x, ids, w, dy, lean)
    once = step(experts, x, ids, w, dy, lean, retain_graph=True)
    for a, b in zip(ref, once):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        hooked = step(experts, x, ids, w, dy, lean)
    for a, b in zip(ref, hooked):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class _Layer(torch.nn.Module):
    """``h + expert_layer(h, top-k of a router, its softmax weights, experts)``."""

    def __init__(self, H: int, F: int, E: int, K: int, lean: bool) -> None:
        super().__init__()
        self.router = torch.nn.Linear(H, E, bias=False)
        self.experts = make_experts(E, H, F)
        self.K, self.lean = K, lean

    def forward(self, h):
        probs, ids = self.router(h).softmax(-1).topk(self.K, dim=-1)
        return h + expert_layer(h, ids, probs, self.experts, lean=self.lean)


@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_offloaded_stack_is_bitwise(lean):
    """Under offload_activations (saved tensors go to host memory and come back as new
    tensors, which the default mode must not release) a stack of layers gives the gradients
    of the same stack without offloading, bit for bit."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(_Layer(32, 16, 4, 2, lean) for _ in range(3))
    x = torch.randn(24, 32)

    def run(offload):
        for p in layers.parameters():
            p.grad = None
        xr = x.clone().requires_grad_()
        scope = fuseops.offload_activations(**offload) if offload is not None else contextlib.nullcontext()
        with scope as handle:
            h = xr
            for layer in layers:
                with handle.group() if handle is not None else contextlib.nullcontext():
                    h = layer(h)
        h.square().mean().backward()
        return [h.detach(), xr.grad] + [p.grad.clone() for p in layers.parameters()], handle

    want, _ = run(None)
    got, handle = run(dict(min_tensor_bytes=0, group_budget_bytes=None, keep_last=0))
    assert handle.stats["bytes_offloaded"] > 0 and handle.stats["bytes_offloaded"] == handle.stats["bytes_reloaded"]
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"tensor {i} differs"


def test_falls_back_to_the_composition_and_says_why():
    x, ids = torch.randn(4, 16), routing(4, 2, 2, 0)
    plain = fuseops.Sequential(ops.GroupedLinear(2, 16, 8), ops.GELU(), ops.GroupedLinear(2, 8, 16))
    assert "not a gated activation" in expert_layer_fallback(x, ids, None, plain)
    biased = fuseops.Sequential(ops.GroupedLinear(2, 16, 16), ops.SwiGLU(), ops.GroupedLinear(2, 8, 16, bias=True))
    assert "FC2 has a bias" in expert_layer_fallback(x, ids, None, biased)
    assert "fuse=False" in expert_layer_fallback(x, ids, None, unfused(make_experts(2, 16, 8)))
    with fuseops.autocast(recipe=fuseops.recipes.FP8CurrentScaling()):
        assert "lean under a recipe" in expert_layer_fallback(x, ids, None, make_experts(2, 16, 8), lean=True)
    for experts in (plain, biased):
        compare_fallback(experts)


def compare_fallback(experts):
    x, ids, w, dy = torch.randn(5, 16), routing(5, 2, 2, 0), torch.rand(5, 2), torch.randn(5, 16)
    got = step(experts, x, ids, w, dy)
    x_sorted, split, row_map = fuseops.moe.permute(x, ids, 2)
    ref = fuseops.moe.unpermute(experts(x_sorted, split, split), row_map, w)
    torch.testing.assert_close(got[0], ref.detach())


MAIN_GRAD_OWNERS = {"fc1": (0,), "fc2": (2,), "both": (0, 2)}


def into_main_grad(experts, which):
    """``experts`` with ``accumulate_into_main_grad`` on the GroupedLinears ``which`` names, each
    given a zero float32 ``main_grad``."""
    for i in MAIN_GRAD_OWNERS[which]:
        experts[i].accumulate_into_main_grad = True
        experts[i].weight.main_grad = torch.zeros(experts[i].weight.shape, device=experts[i].weight.device)
    return experts


def _kernel_paths():
    interpreted = pytest.param(interpreted_kernels, id="kernels",
                               marks=pytest.mark.skipif(not INTERPRET, reason="Triton interpreter (CPU) only"))
    return [pytest.param(contextlib.nullcontext, id="reference"), interpreted]


@pytest.mark.parametrize("kernels", _kernel_paths())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# (T, K, H, F, E). "several-slabs": 80 rows a group, more than one slab of the interpreted wgrad's 32 rows
# (a wgrad whose sum starts from main_grad makes two micro-batches unequal to twice one there).
@pytest.mark.parametrize("shape", [(9, 2, 16, 8, 3), (3, 1, 8, 16, 5), (80, 2, 16, 8, 2)],
                         ids=["fc2-wgrad-first", "fc1-wgrad-first", "several-slabs"])
@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
@pytest.mark.parametrize("which", MAIN_GRAD_OWNERS)
def test_weight_gradients_go_into_main_grad(which, lean, shape, dtype, kernels):
    with kernels():
        check_main_grad(which, lean, shape, dtype, "cpu")


def check_main_grad(which, lean, shape, dtype, device):
    """``accumulate_into_main_grad`` on FC1, FC2 or both: the layer runs (no fallback), the wgrad
    kernel adds each such weight's gradient in float32 to its ``main_grad`` (float32 weights: their
    gradient bit for bit; bf16: within its rounding), two micro-batches twice one bit for bit, and
    ``.grad`` stays None; every other gradient is the run's without ``main_grad``, bit for bit. A
    buffer swapped between micro-batches gets the next one's (read at each backward, as
    GroupedLinear reads it). Both orders of the weight gradients (``test_both_backward_orders``)."""
    T, K, H, F, E = shape
    plain = make_experts(E, H, F, bias=True, dtype=dtype, device=device)
    mine = into_main_grad(copy.deepcopy(plain), which)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g).to(device, dtype)
    ids, w = routing(T, E, K, 0, device=device), torch.rand(T, K, generator=g).to(device)
    dy = torch.randn(T, H, generator=g).to(device, dtype)

    def run(experts):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        for p in experts.parameters():
            p.grad = None
        expert_layer(xg, ids, wg, experts, lean=lean).backward(dy)
        return [xg.grad, wg.grad] + [p.grad for p in experts.parameters()]

    assert expert_layer_fallback(x, ids, w, mine, lean=lean) is None
    want = run(plain)
    got = run(mine)
    first = {i: mine[i].weight.main_grad for i in MAIN_GRAD_OWNERS[which]}
    run(mine)
    for i in first:
        mine[i].weight.main_grad = torch.zeros_like(first[i])
    run(mine)
    names = ["dx", "dweights"] + [n for n, _ in plain.named_parameters()]
    owners = {f"{i}.weight" for i in MAIN_GRAD_OWNERS[which]}
    for name, a, b in zip(names, got, want, strict=True):
        if name in owners:
            assert a is None, f"{name}: .grad set with accumulate_into_main_grad"
        else:
            assert torch.equal(a, b), f"{name} differs from the run without main_grad"
    for i, twice in first.items():
        once = mine[i].weight.main_grad
        plain_grad = dict(plain.named_parameters())[f"{i}.weight"].grad
        fc = f"FC{i // 2 + 1}"
        if dtype == torch.float32:
            assert torch.equal(once, plain_grad), f"{fc}: main_grad is not the float32 gradient"
        else:
            # Written in bf16 the wgrad sums its products in another order than into main_grad
            # (the interpreted kernel's tiles differ): equal within bf16's rounding.
            assert rel_err(once, plain_grad.float()) <= REL_TOL[dtype], f"{fc}: main_grad is not the gradient"
        assert torch.equal(twice, 2 * once), f"{fc}: two micro-batches are not twice one"


def test_a_missing_main_grad_is_named_at_backward():
    """As the composition's GroupedLinear: the buffer is the caller's, checked when the backward
    needs it."""
    experts = make_experts(2, 16, 8)
    experts[2].accumulate_into_main_grad = True
    x = torch.randn(5, 16, requires_grad=True)
    y = expert_layer(x, routing(5, 2, 2, 0), None, experts)
    with pytest.raises(ValueError, match=r"weight\.main_grad: expected a float32 tensor of shape \[2, 16, 8\]"):
        y.sum().backward()


def test_compiled_with_main_grad_runs_the_composition(monkeypatch):
    """Under torch.compile the layer's operators are functional: with ``accumulate_into_main_grad``
    the composition runs (its GroupedLinears add into main_grad), and says so; over two steps its
    buffers match the eager layer's within float32 rounding, ``.grad`` stays None."""
    x, ids, w = torch.randn(7, 16), routing(7, 3, 2, 0), torch.rand(7, 2)
    eager, compiled = into_main_grad(make_experts(3, 16, 8), "both"), into_main_grad(make_experts(3, 16, 8), "both")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert "accumulate_into_main_grad under torch.compile" in expert_layer_fallback(x, ids, w, compiled)
    monkeypatch.undo()
    torch._dynamo.reset()
    layer = torch.compile(lambda *a: expert_layer(*a, compiled), backend="aot_eager", fullgraph=True)
    for _ in range(2):
        expert_layer(x, ids, w, eager).square().sum().backward()
        layer(x, ids, w).square().sum().backward()
    for i in (0, 2):
        assert compiled[i].weight.grad is None
        got, want = compiled[i].weight.main_grad, eager[i].weight.main_grad
        assert want.abs().sum() > 0 and rel_err(got, want) <= REL_TOL[torch.float32], f"FC{i // 2 + 1}"


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda e, x, i, w: expert_layer(x, i, w, ops.GroupedLinear(3, 16, 16)), TypeError, "experts: expected"),
        (lambda e, x, i, w: expert_layer(x, i, w, fuseops.Sequential(
            ops.GroupedLinear(3, 16, 16), ops.SwiGLU(), ops.GroupedLinear(2, 8, 16))), ValueError, "same number"),
        (lambda e, x, i, w: expert_layer(x[:, :8], i, w, e), ValueError, "x: expected 16 features"),
        (lambda e, x, i, w: expert_layer(x, i, w, e, lean=1), TypeError, "lean: expected True or False"),
        (lambda e, x, i, w: expert_layer(x, i.float(), w, e), TypeError, "expert_ids: expected an integer"),
        (lambda e, x, i, w: expert_layer(x, i + 3, w, e), ValueError, r"expert_ids: expected values in \[0, 3\)"),
        (lambda e, x, i, w: expert_layer(x, i, w[:, :1], e), ValueError, "weights: expected shape"),
        (lambda e, x, i, w: expert_layer(x, i, w.double(), e), TypeError, "weights: expected float32"),
        (lambda e, x, i, w: expert_layer(x[0], i, w, e), ValueError, "x: expected a 2-D tensor"),
        (lambda e, x, i, w: expert_layer(x, i, w, fuseops.Sequential(
            ops.GroupedLinear(3, 16, 16), ops.SwiGLU(), ops.GroupedLinear(3, 6, 16))), ValueError,
         r"GroupedLinear input: expected shape \[\.\.\., 6\]"),
    ],
    ids=["not-sequential", "group-mismatch", "features", "lean-flag", "float-ids", "ids-range", "weights-shape",
         "weights-dtype", "x-1d", "widths"],
)
def test_bad_input_raises_before_any_kernel(call, error, match):
    experts = make_experts(3, 16, 8)
    with pytest.raises(error, match=match):
        call(experts, torch.randn(4, 16), routing(4, 3, 2, 0), torch.rand(4, 2))


# (T, H, F): FC2's weight gradient first at the first shape, FC1's at the second (memory_model).
GPU_SHAPES = {"fc2-wgrad-first": (384, 128, 96), "fc1-wgrad-first": (64, 128, 256)}


def _gpu_case(lean, shape="fc2-wgrad-first"):
    device = cuda_or_skip()
    (T, H, F), E, K = GPU_SHAPES[shape], 8, 2
    experts = make_experts(E, H, F, bias=True, dtype=torch.bfloat16, device=device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    ids, weights, route = reroutable(T, E, K, device)
    dy = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    leaves = [x, weights, *experts.parameters()]

    def run() -> torch.Tensor:
        for t in leaves:
            t.grad = None
        y = expert_layer(x, ids, weights, experts, lean=lean)
        y.backward(dy)
        return y

    return experts, leaves, route, run


@pytest.mark.gpu
@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_gpu_no_host_sync(lean):
    experts, _, route, run = _gpu_case(lean)
    route(0)
    run()  # warm-up: compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_gpu_captures_in_cuda_graph(lean, shape):
    experts, leaves, route, run = _gpu_case(lean, shape)
    assert_replay_equals_eager(run, route, leaves)


@pytest.mark.gpu
@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_gpu_equals_the_composition(lean):
    """Against float64, beside the composition: a mid size, empty experts, no tokens, wide
    experts, and skewed routing (every even token's first choice is expert 0: half the rows)."""
    device = cuda_or_skip()
    for T, F, empty, skewed in ((300, 96, (), False), (64, 96, (0, 2, 5), False), (0, 96, (), False),
                                (64, 256, (), False), (512, 96, (), True)):
        experts = make_experts(8, 128, F, bias=False, dtype=torch.bfloat16, device=device)
        g = torch.Generator().manual_seed(T)
        x = torch.randn(T, 128, generator=g).to(device, torch.bfloat16)
        ids = routing(T, 8, 2, T, device=device, empty=empty)
        if skewed:
            ids[::2, 0] = 0
            ids[::2, 1] = torch.where(ids[::2, 1] == 0, 1, ids[::2, 1])
        w = torch.rand(T, 2, generator=g).to(device)
        dy = torch.randn(T, 128, generator=g).to(device, torch.bfloat16)
        fused = step(experts, x, ids, w, dy, lean)
        plain = step(unfused(experts), x, ids, w, dy)
        exact = step(unfused(experts, torch.float64), x.double(), ids, w.double(), dy.double())
        check_close(fused, plain, exact, torch.bfloat16, ["y", "dx", "dweights", "w1", "w2"])


@pytest.mark.gpu
@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_gpu_weight_gradients_go_into_main_grad(lean):
    """``test_weight_gradients_go_into_main_grad`` on the GPU's wgrad kernels (on sm_90 the Gluon
    one, its main_grad tile loaded under the main loop), bf16, both weights and FC2's alone."""
    device = cuda_or_skip()
    for which in ("both", "fc2"):
        check_main_grad(which, lean, (300, 2, 128, 96, 8), torch.bfloat16, device)


@pytest.mark.gpu
def test_gpu_peak_memory_follows_the_byte_accounting():
    """Peak above the step's start, measured by the caching allocator, at a Qwen3-like shape
    (many narrow experts, top-8): within memory_model's count (plus the O(T*K) routing maps),
    the default below the composition and lean below the default."""
    device = cuda_or_skip()
    T, K, H, F, E = 4096, 8, 512, 192, 32
    experts = make_experts(E, H, F, dtype=torch.bfloat16, device=device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16, requires_grad=True)
    logits = torch.randn(T, E, device=device)
    top, ids = logits.topk(K, dim=-1)
    w = top.softmax(-1).requires_grad_()
    dy = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    scaled = fuseops.Sequential(*[experts[0], ops.SwiGLU(scaled=True), experts[2]])

    def composed():
        x_sorted, split, row_map = fuseops.moe.permute(x, ids, E)
        probs = w.new_empty(T * K).scatter(0, row_map.reshape(-1), w.reshape(-1))
        fuseops.moe.unpermute(scaled(x_sorted, split, probs, split), row_map, None).backward(dy)

    def peak(fn):
        for t in (x, w, *experts.parameters()):
            t.grad = None
        fn()  # warm-up (compiles)
        for t in (x, w, *experts.parameters()):
            t.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    shape = mm.LayerShape(T, K, H, F, E)
    measured = {
        "composed": peak(composed),
        "default": peak(lambda: expert_layer(x, ids, w, experts).backward(dy)),
        "lean": peak(lambda: expert_layer(x, ids, w, experts, lean=True).backward(dy)),
    }
    modelled = {
        "composed": mm.peak_bytes(shape, mm.composed_stages()),
        "default": mm.peak_bytes(shape, mm.layer_stages(False, *mm.backward_plan(shape, False))),
        "lean": mm.peak_bytes(shape, mm.layer_stages(True, *mm.backward_plan(shape, True))),
    }
    routing_maps = 64 * T * K  # row maps, probs, their gradients, partial sums: O(T*K) scalars
    for name in measured:
        assert measured[name] <= modelled[name] * 1.02 + routing_maps, (name, measured, modelled)
    assert measured["lean"] < measured["default"] < measured["composed"], measured


class _RowsCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """The widths of the tensors of ``rows`` rows (2-D) that aten ops make (outputs in no
    input's storage: not views, not written in place), sorted."""

    def __init__(self, rows):
        super().__init__()
        self.rows, self.made = rows, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[0] == self.rows
                    and t.untyped_storage().data_ptr() not in inputs):
                self.made.append(t.shape[1])
        return out

    def widths(self, but: tuple[int, ...]) -> list[int]:
        return sorted(w for w in self.made if w not in but)


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
def test_lean_makes_no_permuted_copy_of_x(bf16):
    """The [T*K, H] tensors (and column slices of them) a step of the kernels makes: lean's
    forward one (FC2's output; FC1 reads x's rows in place), the default's two (x_sorted too,
    for FC1 alone); lean's backward one (FC1's input gradient: FC1's recompute and weight
    gradient gather x's rows, FC2's gradients dy's), the default's dy_sorted and FC1's input
    gradient, and x_sorted again for FC1's weight gradient in the column slices memory_model
    plans (here 3 of 8 columns); and lean equals the default. (The CPU references gather
    copies.)"""
    if not INTERPRET:
        pytest.skip("the kernels on CPU tensors need TRITON_INTERPRET=1")
    dtype = torch.bfloat16 if bf16 else torch.float32
    T, K, E, H, F = 6, 2, 4, 24, 6
    assert mm.backward_plan(mm.LayerShape(T, K, H, F, E, dtype.itemsize), False) == (False, 4)
    experts = make_experts(E, H, F, dtype=dtype)
    ids, weights = routing(T, E, K, seed=4), torch.rand(T, K, dtype=dtype)
    x, dy = torch.randn(T, H, dtype=dtype), torch.randn(T, H, dtype=dtype)
    made = {}
    with interpreted_kernels():
        for lean in (False, True):
            xr = x.clone().requires_grad_()
            with _RowsCounter(T * K) as forward:
                y = expert_layer(xr, ids, weights, experts, lean=lean)
            with _RowsCounter(T * K) as backward:
                y.backward(dy)
            # But the routing's permute of no columns, the gated activation (F), the
            # pre-activation (2F) and their gradients.
            made[lean] = (forward.widths((0, F, 2 * F)), backward.widths((0, F, 2 * F)))
        lean, default = step(experts, x, ids, weights, dy, lean=True), step(experts, x, ids, weights, dy)
    assert made[True] == ([H], [H]), made
    assert made[False] == ([H, H], [8, 8, 8, H, H]), made
    for a, b in zip(lean, default, strict=True):
        torch.testing.assert_close(a, b, **({} if not bf16 else dict(rtol=2e-2, atol=2e-2)))


@pytest.mark.parametrize("columns", [0, 5, 24, 2048, 2049])
@pytest.mark.parametrize("parts", mm.X_PARTS)
def test_column_parts_tile_the_row(columns, parts):
    """The slices FC1's weight gradient is made in cover the row once, in order, at most
    ``parts`` of them, each but the last a multiple of 8 wide (none for no columns)."""
    slices = mm.column_parts(columns, parts)
    assert len(slices) <= parts
    assert [c for start, stop in slices for c in range(start, stop)] == list(range(columns))
    assert all((stop - start) % 8 == 0 for start, stop in slices[:-1])
