"""Every registered fusion equals its basic ops: outputs and all gradients, on generated
shapes, dtypes and inputs. The suite enumerates the registry; a new fusion is covered
by being registered."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fuseops
from fuseops.fuser import plan_config
from fuseops.fusions import REGISTRY, Fusion, Stage
from fuseops.fusions.fusion import measured_declines_ignored
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.quant import recipes
from tests.fusions.op_strategies import op_chain
from tests.helpers import REL_TOL, assert_bitwise, nudged, quantized_rel_tol, rel_err, sm90_routes

DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
QUANTIZED = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]
# Unquantized half the time; fusions that need no recipe decline under one, and say so.
RECIPES = st.sampled_from([None, None, None, *QUANTIZED])
LEADING = st.sampled_from([(1,), (5,), (2, 3), (33,)])


def _forward_backward(model, x, extras, requires_grad, seed, probe_dtype=None):
    """Outputs, then gradients of a seeded random projection of every output; ``probe_dtype``:
    the projection rounded as a run in that dtype receives it (the float64 oracle's, so that
    it differentiates the same function as the runs it judges)."""
    x = x.detach().clone().requires_grad_(requires_grad)
    extras = [e.detach().clone().requires_grad_() if _is_float(e) else e for e in extras]
    out = model(x, *extras)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    probes = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    if probe_dtype is not None:
        probes = [p.to(probe_dtype).double() for p in probes]
    loss = sum((o.double() * p.to(o.device)).sum() for o, p in zip(outs, probes))
    loss.backward()
    grads = ([x.grad] if requires_grad else []) + [e.grad for e in extras if _is_float(e)]
    return [o.detach() for o in outs], grads + [p.grad for p in model.parameters()]


def _is_float(e):
    return isinstance(e, torch.Tensor) and e.is_floating_point()


def _close_enough(fused, unfused, exact, dtype, recipe, what, nearby=(0.0, 0.0)):
    """Fused is within the dtype's tolerance of float64, or its worst error no worse than twice
    the unfused ops' worst, over the example and, where that fails, its neighbours (``nearby``:
    the two worst errors there, ``_errors_nearby``): rounding differences, not a wrong result.
    Under a recipe, also within the format's own accuracy floor (``quantized_rel_tol``): a fusion
    may round once where the unfused ops round twice (ForwardQuantizeLinear quantizes its input's
    column-wise copy from the input, the unfused Linear from the Quantize op's rounded output),
    and at a few rows the two errors of a 4-bit format differ by more than 2x either way (NVFP4,
    33 rows, K = 1: 0.124 against 0.0086)."""
    assert (fused is None) == (unfused is None), f"{what}: presence differs"
    if fused is None:
        return
    assert torch.isfinite(fused).all() == torch.isfinite(unfused).all(), f"{what}: non-finite values differ"
    err, base = max(rel_err(fused, exact), nearby[0]), max(rel_err(unfused, exact), nearby[1])
    floor = _floor(dtype, recipe)
    assert err <= max(2 * base, floor), (
        f"{what}: error {err:.2e} against float64 (unfused: {base:.2e}; the worst of the example"
        f"{' and its neighbours' if any(nearby) else ''}; tolerance {floor:.1e}, {dtype}, {recipe})"
    )


def _floor(dtype, recipe) -> float:
    """The error any result may have: the dtype's tolerance, or the recipe format's floor."""
    return max(REL_TOL[dtype], quantized_rel_tol(recipe) if recipe is not None else 0.0)


def _errors_nearby(unfused, x, extras, requires_grad, seed, recipe, draws=8):
    """Per output and gradient, the worst error against float64 of the fused and of the unfused ops over
    ``draws`` neighbours of the example: each element of its input, extra inputs and parameters moved by a
    unit or two in the dtype's last place, or kept (``nudged``). Where a handful of rows makes a result a few
    roundings (exact GELU in bf16 at one row, its derivative crossing zero near z = -0.75: random runs
    have found the weight gradient at 2.4e-2 fused against 6.7e-3 unfused, and at the neighbours each path
    ranges over 5e-3 to 3e-2; GroupedMLP in float16 at six rows, 1.12e-3 against 5.2e-4, whose neighbours find
    fused at most 5.1e-4 and unfused up to 8.9e-4), one example's errors are one draw from each path's spread,
    and twice one draw fails a correct fusion at random. The worst of several draws of each compares the
    spreads: a fusion that rounds worse everywhere still fails."""
    dtype = x.dtype
    g = torch.Generator().manual_seed(seed + 1)
    worst = None
    for _ in range(draws):
        model = copy.deepcopy(unfused)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(nudged(p, dtype, g))
        fused = copy.deepcopy(model)
        fused.fuse = True
        exact = copy.deepcopy(model).to(device="cpu", dtype=torch.float64)
        for m in (model, fused, exact):
            m.zero_grad(set_to_none=True)
        xn, en = nudged(x, dtype, g), [nudged(e, dtype, g) for e in extras]
        with fuseops.autocast(recipe=recipe):
            fused_outs, fused_grads = _forward_backward(fused, xn, en, requires_grad, seed)
            outs, grads = _forward_backward(model, xn, en, requires_grad, seed)
        exact_extras = [e.double().cpu() if _is_float(e) else e.cpu() if isinstance(e, torch.Tensor) else e
                        for e in en]
        want_outs, want_grads = _forward_backward(exact, xn.double().cpu(), exact_extras, requires_grad, seed,
                                                  probe_dtype=dtype)
        errs = [(0.0, 0.0) if a is None or c is None else (rel_err(a, c.to(a.device)), rel_err(b, c.to(b.device)))
                for a, b, c in zip(fused_outs + fused_grads, outs + grads, want_outs + want_grads)]
        worst = errs if worst is None else [(max(w[0], e[0]), max(w[1], e[1])) for w, e in zip(worst, errs)]
    return worst


def _recipes_for(fusion: Fusion, ops, x, extra_inputs):
    """RECIPES, or only the recipes it applies under for a fusion that needs one: without a
    recipe, a fusion that needs none may take the same ops first (GroupedMLP)."""
    if fusion.guard(ops, plan_config(x, None, True), extra_inputs) is None:
        return RECIPES
    applies = [r for r in QUANTIZED if fusion.guard(ops, plan_config(x, r, True), extra_inputs) is None]
    return st.sampled_from(applies) if applies else RECIPES


def check_fusion(fusion: Fusion, data, device: str) -> None:
    # A fusion off by measurement (its guard says the unfused ops are faster) is checked too.
    with measured_declines_ignored():
        _check_fusion(fusion, data, device)


def _check_fusion(fusion: Fusion, data, device: str) -> None:
    in_features, specs = data.draw(op_chain(fusion.pattern), label="ops")
    dtype = data.draw(DTYPES, label="dtype")
    lead = data.draw(LEADING, label="leading shape")
    requires_grad = data.draw(st.booleans(), label="input requires grad")
    seed = data.draw(st.integers(0, 2**16), label="seed")

    torch.manual_seed(seed)
    fused = fuseops.Sequential(*[s.op for s in specs])
    with torch.no_grad():
        for p in fused.parameters():
            p.normal_(0.0, 1.0 / max(p.shape[-1], 1) ** 0.5).add_(0.1)
    fused.to(device=device, dtype=dtype)
    # The oracle computes in float64 from the parameters as rounded to ``dtype``: the function
    # that fused and unfused both approximate (a mask of ReLU's backward flips otherwise).
    exact = copy.deepcopy(fused).to(device="cpu", dtype=torch.float64)
    exact.fuse = False
    unfused = copy.deepcopy(fused)
    unfused.fuse = False
    x = torch.randn(*lead, in_features, dtype=dtype, device=device)
    per_op, n, shared = [], in_features, {}
    for spec in specs:
        per_op.append(tuple(make(lead, n, dtype, device, shared) for make in spec.extra_inputs))
        n = spec.out_features
    extras = [e for op_extras in per_op for e in op_extras]
    recipe = data.draw(_recipes_for(fusion, [s.op for s in specs], x, per_op), label="recipe")

    with fuseops.autocast(recipe=recipe):
        fused_outs, fused_grads = _forward_backward(fused, x, extras, requires_grad, seed)
        unfused_outs, unfused_grads = _forward_backward(unfused, x, extras, requires_grad, seed)
    # The float64 oracle runs the torch references on the CPU, unquantized.
    exact_extras = [e.double() if _is_float(e) else e for e in extras]
    exact_extras = [e.cpu() if isinstance(e, torch.Tensor) else e for e in exact_extras]
    exact_outs, exact_grads = _forward_backward(exact, x.double().cpu(), exact_extras, requires_grad, seed,
                                                probe_dtype=dtype)

    plan = fused.plan
    entries = (plan.forward if fusion.stage & Stage.FORWARD else []) + (
        plan.backward if fusion.stage & Stage.BACKWARD else []
    )
    declined = [d for d in plan.declined if d[0] == fusion.name]
    assert any(name == fusion.name for name, _ in entries) or declined, (
        f"{fusion.name} matched {[type(s.op).__name__ for s in specs]} but is not in the plan"
    )
    results = list(zip(fused_outs + fused_grads, unfused_outs + unfused_grads,
                       [None if c is None else c.to(device) for c in exact_outs + exact_grads]))
    # The neighbours only where the example alone fails the rule.
    nearby = [(0.0, 0.0)] * len(results)
    floor = _floor(dtype, recipe)
    if any(a is not None and c is not None and rel_err(a, c) > max(2 * rel_err(b, c), floor) for a, b, c in results):
        nearby = _errors_nearby(unfused, x, extras, requires_grad, seed, recipe)
    for i, ((a, b, c), near) in enumerate(zip(results, nearby)):
        _close_enough(a, b, c, dtype, recipe, f"{fusion.name} output/grad {i}", near)
    if recipe is None:
        _repeated_calls_agree(fused, x, extras, requires_grad, seed, fusion.name)


def _repeated_calls_agree(model, x, extras, requires_grad, seed, what):
    """Later calls of one signature reuse the run the first prepared (``fuseops/call_cache.py``):
    their outputs and gradients are the first call's, bit for bit."""
    runs = []
    for _ in range(2):
        for p in model.parameters():
            p.grad = None
        outs, grads = _forward_backward(model, x, extras, requires_grad, seed)
        runs.append(outs + grads)
    for i, (first, again) in enumerate(zip(*runs)):
        assert_bitwise(again, first, f"{what} repeated output/grad {i}")


@pytest.mark.parametrize("fusion", REGISTRY, ids=lambda f: f.name)
@given(data=st.data())
def test_fusion_equals_basic_ops(fusion, data):
    check_fusion(fusion, data, "cpu")


@pytest.mark.skipif(not INTERPRET, reason="the interpreter runs only on CPU-only machines")
@pytest.mark.parametrize("fusion", REGISTRY, ids=lambda f: f.name)
@settings(max_examples=4)
@given(data=st.data())
def test_fusion_equals_basic_ops_with_triton_kernels(fusion, data):
    with interpreted_kernels():
        check_fusion(fusion, data, "cpu")


@pytest.mark.skipif(not INTERPRET, reason="the interpreter runs only on CPU-only machines")
@pytest.mark.parametrize("fusion", REGISTRY, ids=lambda f: f.name)
@settings(max_examples=3)
@given(data=st.data())
def test_fusion_equals_basic_ops_on_the_sm90_routes(fusion, data):
    with interpreted_kernels(), sm90_routes():
        check_fusion(fusion, data, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("fusion", REGISTRY, ids=lambda f: f.name)
# Each new shape compiles new kernel specialisations on the GPU (seconds each).
@settings(max_examples=10)
@given(data=st.data())
def test_fusion_equals_basic_ops_on_cuda(fusion, data):
    check_fusion(fusion, data, "cuda")
