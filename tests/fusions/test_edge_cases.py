"""Edge cases over the registry: every basic op (a one-op pattern per builder of
``op_strategies.BUILDERS``) and every registered fusion, fused and unfused, every dtype and
recipe, forward and backward, on

- zero rows (an expert-parallel rank that gets no tokens; grouped ops get all-zero splits),
- one row,
- one non-finite element (NaN, +inf or -inf) in the input,
- values at the dtype's maximum (ops without a GEMM: a GEMM of maxima overflows in its
  accumulator as torch's own does). There torch in the dtype itself differs from float64
  (its fp32 layer_norm of maxima is NaN), so the claim is about the recipes: a quantized run
  has non-finite values exactly where the same run without a recipe has them (quantization
  turns no finite value into inf or NaN),
- non-contiguous inputs (a strided view),

against the float64 oracle (the torch references of the same ops in float64). Non-finite
values must sit where the oracle puts them: NaN and inf exactly without a recipe; under a
recipe, non-finite exactly where the oracle has one (E4M3 holds no inf, so an inf may read
back NaN), NVFP4 widened to the 16-element blocks it documents. A new op (a builder) or a
fusion (a registry entry) is covered without test code of its own.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fuseops
from fuseops import ops
from fuseops.fusions import REGISTRY
from fuseops.fusions.fusion import OpMatch, measured_declines_ignored
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.quant import recipes
from tests.fusions.op_strategies import BUILDERS, op_chain
from tests.helpers import REL_TOL

QUANTIZED = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
CASES = ("zero_rows", "one_row", "non_finite", "dtype_max", "non_contiguous")
_GEMMS = (ops.Linear, ops.GroupedLinear)

# (name, pattern): each basic op alone, then each fusion's pattern.
SUBJECTS = [(cls.__name__, (OpMatch((cls,)),)) for cls in sorted(BUILDERS, key=lambda c: c.__name__)]
SUBJECTS += [(f.name, f.pattern) for f in REGISTRY]


def _leading(case: str) -> tuple[int, ...]:
    return {"zero_rows": (0,), "one_row": (1,)}.get(case, (6,))


def _input(case, lead, features, dtype, device, data):
    x = torch.randn(*lead, features * (2 if case == "non_contiguous" else 1), dtype=dtype, device=device)
    if case == "non_contiguous":
        x = x[..., ::2]
        assert not x.is_contiguous() or x.numel() <= 1
    elif case == "non_finite":
        value = data.draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]), label="value")
        r = data.draw(st.integers(0, lead[0] - 1), label="row")
        c = data.draw(st.integers(0, features - 1), label="column")
        x[r, c] = value
    elif case == "dtype_max":
        fmax = torch.finfo(dtype).max
        x = torch.where(torch.rand_like(x, dtype=torch.float32) < 0.5, -fmax, fmax).to(dtype) * torch.rand(
            lead + (1,), device=device).to(dtype).clamp(min=0.5)
    return x


def _run(model, x, extras, seed, probe_dtype=None):
    """Outputs and gradients of a seeded random projection of the outputs; ``probe_dtype``: the
    projection rounded as a run in that dtype rounds it (the float64 oracle's, so that it
    differentiates the same function: two input features of float16 lost 2 % of the bound to
    the rounding of the model's projection alone)."""
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    extras = [e.detach().clone().requires_grad_() if _is_float(e) else e for e in extras]
    out = model(x, *extras)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    probes = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    if probe_dtype is not None:
        probes = [p.to(probe_dtype) for p in probes]
    torch.autograd.backward([o for o in outs], [p.to(o.dtype).to(o.device) for p, o in zip(probes, outs)])
    grads = [x.grad] + [e.grad for e in extras if _is_float(e)] + [
        None if p.grad is None else p.grad.clone() for p in model.parameters()]
    return [o.detach() for o in outs], grads


def _is_float(e):
    return isinstance(e, torch.Tensor) and e.is_floating_point()


def _blocks16(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` widened to aligned blocks of 16 along its last dim and, for 2-dim and larger
    tensors, its first (NVFP4 quantizes along either)."""
    m = mask.clone()
    for dim in {m.dim() - 1, 0} if m.dim() > 1 else {0}:
        n = m.shape[dim]
        pad = (-n) % 16
        shape = list(m.shape)
        shape[dim] = pad
        padded = torch.cat([m, m.new_zeros(shape)], dim)
        blocks = padded.unflatten(dim, (-1, 16)).any(dim + 1, keepdim=True)
        m = blocks.expand(*padded.unflatten(dim, (-1, 16)).shape).flatten(dim, dim + 1).narrow(dim, 0, n)
    return m


def _compare(got, exact, dtype, recipe, case, what, as_nan=None):
    assert (got is None) == (exact is None), f"{what}: presence differs"
    if got is None:
        return
    assert got.shape == exact.shape, f"{what}: shape {tuple(got.shape)} != {tuple(exact.shape)}"
    if got.numel() == 0:
        return
    ref = exact
    bad, ref_bad = ~torch.isfinite(got), ~torch.isfinite(ref)
    if recipe is None:
        assert torch.equal(got.isnan(), ref.isnan()), f"{what}: NaN at {got.isnan().nonzero().tolist()[:4]}, " \
                                                      f"oracle {ref.isnan().nonzero().tolist()[:4]}"
        assert torch.equal(got.isinf(), ref.isinf()), f"{what}: inf positions differ"
    else:
        # E4M3 and E2M1 hold no inf: an inf may read back NaN, which a later ReLU or clamp
        # treats unlike the inf. So a value is non-finite where both the oracle and the
        # oracle given NaN for the inf say so, and finite where both do.
        nan_bad = ~torch.isfinite(as_nan) if as_nan is not None else ref_bad
        lower, upper = ref_bad & nan_bad, ref_bad | nan_bad
        if isinstance(recipe, recipes.NVFP4):
            upper = _blocks16(upper)
        assert (bad | ~lower).all(), f"{what}: the oracle's non-finite values at {lower.nonzero().tolist()[:4]} " \
                                     f"are finite here"
        assert (~bad | upper).all(), f"{what}: non-finite at {bad.nonzero().tolist()[:4]}, " \
                                     f"oracle {upper.nonzero().tolist()[:4]}"
    keep = ~bad & ~ref_bad
    # Quantized results are checked for placement only (their accuracy: tests/ops/test_quantized.py).
    if recipe is not None or not keep.any() or case == "dtype_max":
        return
    # Norm-wise, with a floor: a gradient that cancels to ~0 (one feature) carries its
    # float32 rounding relative to the terms it cancelled, not to itself.
    diff = (got[keep].double() - ref[keep]).norm()
    scale = max(ref[keep].norm().item(), 0.1 * keep.sum().item() ** 0.5)
    assert diff <= 4 * REL_TOL[dtype] * scale, f"{what}: error {diff:.2e} of {scale:.2e} ({dtype})"


def check(pattern, case, data, device="cpu"):
    # Fusions off by measurement (their guards say the unfused ops are faster) are covered too.
    with measured_declines_ignored():
        _check(pattern, case, data, device)


def _check(pattern, case, data, device="cpu"):
    in_features, specs = data.draw(op_chain(pattern), label="ops")
    ops_ = [s.op for s in specs]
    if case == "dtype_max" and any(isinstance(o, _GEMMS) for o in ops_):
        # A GEMM of maxima overflows in its accumulator (module docstring).
        return
    dtype = data.draw(DTYPES, label="dtype")
    recipe = data.draw(st.sampled_from([None, None, *QUANTIZED]), label="recipe")
    fuse = data.draw(st.booleans(), label="fuse")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    torch.manual_seed(seed)
    model = fuseops.Sequential(*ops_)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 1.0 / max(p.shape[-1], 1) ** 0.5).add_(0.1)
    model.to(device=device, dtype=dtype)
    model.fuse = fuse
    exact = copy.deepcopy(model).to(device="cpu", dtype=torch.float64)
    exact.fuse = False
    lead = _leading(case)
    x = _input(case, lead, in_features, dtype, device, data)
    extras, n, shared = [], in_features, {}
    for spec in specs:
        extras += [make(lead, n, dtype, device, shared) for make in spec.extra_inputs]
        n = spec.out_features
    with fuseops.autocast(recipe=recipe):
        outs, grads = _run(model, x, extras, seed)
    if case == "dtype_max":
        # The oracle: the same model in the same dtype without a recipe.
        plain_outs, plain_grads = _run(model, x, extras, seed)
        for i, (a, b) in enumerate(zip(outs + grads, plain_outs + plain_grads)):
            assert (a is None) == (b is None) and (a is None or a.shape == b.shape)
            if a is not None and recipe is not None:
                _compare(a, b.double(), dtype, recipe, "non_finite", f"{case} fuse={fuse} output/grad {i}")
        return
    # Split sizes too: the float64 oracle runs on CPU, where a device tensor of sizes is refused.
    exact_extras = [e.double().cpu() if _is_float(e) else e.cpu() if isinstance(e, torch.Tensor) else e
                    for e in extras]
    exact_outs, exact_grads = _run(exact, x.double().cpu(), exact_extras, seed, probe_dtype=dtype)
    as_nan = [None] * len(exact_outs + exact_grads)
    if case == "non_finite" and recipe is not None:
        x_nan = torch.where(x.isinf(), float("nan"), x.double()).cpu()
        nan_outs, nan_grads = _run(exact, x_nan, exact_extras, seed, probe_dtype=dtype)
        as_nan = nan_outs + nan_grads
    for i, (a, b, c) in enumerate(zip(outs + grads, exact_outs + exact_grads, as_nan)):
        _compare(a, None if b is None else b.to(device), dtype, recipe, case, f"{case} fuse={fuse} output/grad {i}",
                 None if c is None else c.to(device))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name, pattern", SUBJECTS, ids=[n for n, _ in SUBJECTS])
@settings(max_examples=6)
@given(data=st.data())
def test_edge_case(name, pattern, case, data):
    check(pattern, case, data)


@pytest.mark.skipif(not INTERPRET, reason="the interpreter runs only on CPU-only machines")
@pytest.mark.parametrize("case", ("zero_rows", "one_row", "non_contiguous"))
@pytest.mark.parametrize("name, pattern", SUBJECTS, ids=[n for n, _ in SUBJECTS])
@settings(max_examples=2)
@given(data=st.data())
def test_edge_case_with_triton_kernels(name, pattern, case, data):
    # Non-finite inputs through the interpreter: its float8 upcast decodes NaN codes as
    # numbers (tests/ops/test_quantized_non_finite.py), so those run on the GPU below.
    with interpreted_kernels():
        check(pattern, case, data)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name, pattern", SUBJECTS, ids=[n for n, _ in SUBJECTS])
@settings(max_examples=8)
@given(data=st.data())
def test_edge_case_on_cuda(name, pattern, case, data):
    check(pattern, case, data, "cuda")


@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("recipe", [None, *QUANTIZED], ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("gate", [ops.SwiGLU, ops.GeGLU, ops.ReGLU, ops.SReGLU, ops.ClampedSwiGLU],
                         ids=lambda c: c.__name__)
def test_expert_mlp_with_all_split_sizes_zero(gate, recipe, fuse):
    """An expert-parallel rank that receives no tokens: forward and backward run, the
    weight gradients are zeros (no token touched them)."""
    model = fuseops.Sequential(ops.GroupedLinear(4, 32, 64), gate(), ops.GroupedLinear(4, 32, 32), fuse=fuse)
    x = torch.randn(0, 32, requires_grad=True)
    for splits in ([0, 0, 0, 0], torch.zeros(4, dtype=torch.int64)):
        with fuseops.autocast(recipe=recipe):
            y = model(x, splits, splits)
        y.sum().backward()
        assert y.shape == (0, 32) and x.grad.shape == (0, 32)
        for p in model.parameters():
            assert torch.equal(p.grad, torch.zeros_like(p))
        model.zero_grad(set_to_none=True)
