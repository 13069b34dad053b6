"""The GEMM kernels multiply float32 operands as torch multiplies float32 matrices on CUDA: in
IEEE precision by default, in TF32 where torch runs float32 matmuls in TF32
(``torch.set_float32_matmul_precision("high")``, ``torch.backends.cuda.matmul.fp32_precision``).
The precision is each launch's ``F32_DOT`` constexpr, decided at the call, never from a plan kept
from a call made under the other setting; other dtypes always launch "ieee" (one
specialization). On the GPU the TF32 products are TF32's accuracy, the IEEE ones float32's."""

from __future__ import annotations

import itertools

import pytest
import torch

from fuseops.kernels._triton import float32_matmul_in_tf32
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import dense, dense_gated, grouped, grouped_gated, grouped_gated_bwd, grouped_wgrad
from tests.helpers import assert_close_rel, cuda_or_skip, float32_matmul_precision
from tests.kernels.launch_capture import captured_launches

# (group sizes, K, N): one tile a group, and several tiles of every kernel's GPU table (a group empty).
SMALL, MID = ([10, 0, 30], 32, 48), ([300, 0, 517, 129, 900], 512, 384)
_GEMM_KERNELS = ("gemm_kernel", "gemm_gated_kernel", "grouped_gemm_kernel", "grouped_gemm_gated_fwd_kernel",
                 "grouped_gemm_gated_bwd_kernel", "grouped_gemm_wgrad_kernel")


def _calls(device, dtype, reference: bool = False, shape=SMALL):
    """One call of every launcher whose kernel multiplies through ``_triton.dot`` (or, with
    ``reference``, of its torch reference), on the same values whatever ``dtype``."""
    g = torch.Generator().manual_seed(0)
    sizes, K, N = shape
    G, M = len(sizes), sum(sizes)

    def t(*dims):
        return torch.randn(*dims, generator=g).to(device, dtype)

    def fn(module, name):
        return getattr(module, f"reference_{name}" if reference else name)

    offsets = torch.tensor([0, *itertools.accumulate(sizes)], device=device)
    a, w, w2, dy, z = t(M, K), t(G, N, K), t(G, K, N // 2), t(M, K), t(M, N)
    silu = Activation.SILU
    return {
        "dense": lambda: fn(dense, "gemm")(a, w[0].t(), act=Activation.GELU_TANH, save_preact=True),
        "dense gated": lambda: fn(dense_gated, "gemm_gated")(a, w[0].t(), act=silu),
        "grouped": lambda: fn(grouped, "grouped_gemm")(a, w.transpose(1, 2), offsets),
        "grouped gated": lambda: fn(grouped_gated, "grouped_gemm_gated")(a, w.transpose(1, 2), offsets, act=silu),
        "grouped gated dgrad": lambda: fn(grouped_gated_bwd, "grouped_gemm_dgrad_gated")(dy, w2, offsets, z, act=silu),
        "grouped wgrad": lambda: fn(grouped_wgrad, "grouped_gemm_wgrad")(dy, z, offsets),
    }


def _precisions(call) -> list[str]:
    """The ``F32_DOT`` of each GEMM launch of ``call`` (``launch`` stubbed: nothing runs)."""
    with captured_launches(extra_modules=(dense, grouped_wgrad)) as launches:
        call()
    found = [kw["F32_DOT"] for kernel, _, _, kw in launches if getattr(kernel, "fn", kernel).__name__ in _GEMM_KERNELS]
    assert found, "no GEMM kernel launched"
    return found


@pytest.mark.parametrize("name", list(_calls("cpu", torch.float32)))
def test_float32_operands_launch_the_precision_torch_asks_for_now(name):
    call = _calls("cpu", torch.float32)[name]
    # The order catches a launch plan kept across the setting: ieee, tf32, ieee again.
    with float32_matmul_precision("ieee"):
        first = _precisions(call)
    with float32_matmul_precision("tf32"):
        tf32 = _precisions(call)
    with float32_matmul_precision("ieee"):
        again = _precisions(call)
    assert set(first) == set(again) == {"ieee"}
    assert set(tf32) == {"tf32"}


def test_set_float32_matmul_precision_high_reaches_the_kernels():
    call = _calls("cpu", torch.float32)["grouped"]
    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        high = _precisions(call)
        torch.set_float32_matmul_precision("highest")
        highest = _precisions(call)
    finally:
        torch.set_float32_matmul_precision(saved)
    assert set(high) == {"tf32"} and set(highest) == {"ieee"}


@pytest.mark.parametrize("setting", ["high", "medium", "highest", "tf32", "ieee", "allow_tf32", "disallow_tf32"])
def test_the_setting_is_read_as_torch_reads_it(setting):
    # float32_matmul_in_tf32 calls the getter behind torch.backends.cuda.matmul.fp32_precision
    # directly: it must agree with the public attribute under every way of setting it.
    saved = torch.backends.cuda.matmul.fp32_precision
    try:
        if setting in ("high", "medium", "highest"):
            torch.set_float32_matmul_precision(setting)
        elif setting.endswith("allow_tf32"):
            torch.backends.cuda.matmul.allow_tf32 = setting == "allow_tf32"
        else:
            torch.backends.cuda.matmul.fp32_precision = setting
        expected = setting in ("high", "medium", "tf32", "allow_tf32")
        assert torch.backends.cuda.matmul.fp32_precision == ("tf32" if expected else "ieee")
        assert float32_matmul_in_tf32() is expected
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(_calls("cpu", torch.float32)))
def test_half_precision_operands_launch_one_specialization_whatever_the_setting(name, dtype):
    call = _calls("cpu", dtype)[name]
    with float32_matmul_precision("tf32"):
        assert set(_precisions(call)) == {"ieee"}


@pytest.fixture
def gpu_tile_tables(monkeypatch):
    """The tile tables a GPU run reads (the interpreter's are one small tile everywhere)."""
    modules = (grouped, grouped_gated, grouped_gated_bwd, grouped_wgrad)
    for module in modules:
        monkeypatch.setattr(module, "INTERPRET", False)
        module._configs.cache_clear()
    yield
    monkeypatch.undo()
    for module in modules:
        module._configs.cache_clear()


def test_float32_tiles_follow_the_precision(gpu_tile_tables):
    # TF32 runs on the tensor cores, IEEE on the FMA units: each has its own measured tile
    # (``benchmarks/float32_precision.py``), picked by the setting at the call.
    picks = {
        "gated": lambda: grouped_gated.pick_config(grouped_gated._configs(), torch.float32, True),
        "wgrad": lambda: grouped_wgrad.pick_wgrad_config(torch.float32, True, True),
    }
    tables = {"gated": grouped_gated._configs(), "wgrad": grouped_wgrad._configs()}
    for name, pick in picks.items():
        assert tables[name]["fp32"] != tables[name]["tf32"], name
        for precision, entry in (("ieee", "fp32"), ("tf32", "tf32"), ("ieee", "fp32")):
            with float32_matmul_precision(precision):
                assert pick() == tables[name][entry], (name, precision)


def _tiled_calls(cfg_of):
    """Every grouped launcher at three groups (one empty, one of 130 rows: two row tiles of the
    GPU tables' 128-row tiles) with each epilogue it has, float32 on the CPU, each with its
    float64 reference: ``{case: (kernel call, reference call)}``; ``cfg_of(module)`` the tile."""
    g = torch.Generator().manual_seed(3)
    sizes, K, F = [130, 0, 70], 64, 96
    G, M = len(sizes), sum(sizes)
    offsets = torch.tensor([0, *itertools.accumulate(sizes)])

    def t(*dims, scale=1.0):
        return torch.randn(*dims, generator=g) * scale

    a, w, w2 = t(M, K), t(G, 2 * F, K, scale=K**-0.5), t(G, K, F, scale=F**-0.5)
    bias, probs, dy, z = t(G, 2 * F), torch.rand(M, generator=g), t(M, K), t(M, 2 * F)
    main_grad = t(G, K, 2 * F)
    silu, gelu = Activation.SILU, Activation.GELU_TANH
    d = {"a": a.double(), "w": w.double(), "w2": w2.double(), "bias": bias.double(), "probs": probs.double(),
         "dy": dy.double(), "z": z.double()}
    cases = {
        "grouped forward": (
            lambda: grouped.launch_grouped_gemm(a, w.transpose(1, 2), offsets, bias, probs, gelu, 1.0, True, None, None,
                                                cfg_of(grouped)),
            lambda: grouped.reference_grouped_gemm(d["a"], d["w"].transpose(1, 2), offsets, bias=d["bias"],
                                                   row_scale=d["probs"], act=gelu, save_preact=True)),
        "grouped dgrad": (
            lambda: grouped.launch_grouped_gemm(z, w, offsets, None, probs, gelu, 1.0, False, a, None, cfg_of(grouped)),
            lambda: grouped.reference_grouped_gemm(d["z"], d["w"], offsets, row_scale=d["probs"], act=gelu,
                                                   act_grad_input=d["a"])),
        "wgrad": (
            lambda: (grouped_wgrad.launch_grouped_gemm_wgrad(dy, z, offsets, None, None, cfg_of(grouped_wgrad),
                                                             out_dtype=torch.float32),
                     grouped_wgrad.launch_grouped_gemm_wgrad(dy, z, offsets, main_grad.clone(), None,
                                                             cfg_of(grouped_wgrad))),
            lambda: (grouped_wgrad.reference_grouped_gemm_wgrad(d["dy"], d["z"], offsets),
                     grouped_wgrad.reference_grouped_gemm_wgrad(d["dy"], d["z"], offsets,
                                                                main_grad=main_grad.double()))),
    }
    for il, cl in itertools.product((False, True), (False, True)):  # interleaved, clamped (limit 2)
        gate64 = {"act": silu, "interleaved": il, "clamped": cl, "limit": 2.0, "probs": d["probs"]}
        cases[f"gated forward interleaved={il} clamped={cl}"] = (
            lambda il=il, cl=cl: grouped_gated.launch_grouped_gemm_gated(
                a, w.transpose(1, 2), offsets, bias, silu, il, cl, 2.0, 1.0, probs, True, None, cfg_of(grouped_gated)),
            lambda gate64=gate64: grouped_gated.reference_grouped_gemm_gated(
                d["a"], d["w"].transpose(1, 2), offsets, bias=d["bias"], save_preact=True, **gate64))
        cases[f"gated dgrad interleaved={il} clamped={cl}"] = (
            lambda il=il, cl=cl: grouped_gated_bwd.launch_grouped_gemm_dgrad_gated(
                dy, w2, offsets, z, silu, il, cl, 2.0, 1.0, probs, True, None, cfg_of(grouped_gated_bwd)),
            lambda gate64=gate64: grouped_gated_bwd.reference_grouped_gemm_dgrad_gated(
                d["dy"], d["w2"], offsets, d["z"], want_h=True, **gate64))
    return cases


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_the_gpu_float32_tiles_compute_every_epilogue(gpu_tile_tables, precision):
    # The GPU tables' float32 tiles (128-row tiles, a gated forward's epilogue in two column
    # slices through pointer stores) never run under the interpreter, whose tables hold one
    # small tile, and were timed on the H100 with a few epilogues only: here each tile with
    # every epilogue, through the interpreter (which multiplies in IEEE whatever the entry).
    with float32_matmul_precision(precision):
        def cfg_of(module):
            if module is grouped:
                return grouped.pick_config(256, torch.float32, False, False)
            if module is grouped_wgrad:
                return grouped_wgrad.pick_wgrad_config(torch.float32, False, True)
            return grouped_gated.pick_config(module._configs(), torch.float32, False)

        for case, (call, reference) in _tiled_calls(cfg_of).items():
            got, want = call(), reference()
            for i, (out, ref) in enumerate(zip(got, want)):
                if ref is not None:
                    assert_close_rel(out, ref, torch.float32, what=f"{case} output {i}")


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dense", "dense gated", "grouped", "grouped gated", "grouped gated dgrad", "grouped wgrad"])
def test_gpu_float32_products_have_the_accuracy_of_the_precision_asked_for(name):
    # The relative error of a TF32 product of K-long rows is ~1e-4-1e-3 (10-bit mantissas),
    # IEEE's ~1e-6: the setting measurably changes the products, and IEEE stays IEEE.
    # At both sizes: the float32 tiles (one a precision) span several row and column tiles of a
    # group only at the larger one.
    device = cuda_or_skip()
    for shape in (SMALL, MID):
        _check_both_precisions(device, name, shape)


def _check_both_precisions(device, name, shape):
    ref = _calls(device, torch.float64, reference=True, shape=shape)[name]()
    ref = ref[0] if isinstance(ref, tuple) else ref
    errors = {}
    for precision in ("ieee", "tf32"):
        with float32_matmul_precision(precision):
            out = _calls(device, torch.float32, shape=shape)[name]()
        errors[precision] = _relative_error(out[0] if isinstance(out, tuple) else out, ref)
    assert errors["ieee"] < 1e-5, errors
    assert 1e-5 < errors["tf32"] < 5e-3, errors
