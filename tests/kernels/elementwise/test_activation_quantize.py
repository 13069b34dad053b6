"""Activations with the quantize epilogue against their references, through the interpreter.

The high-precision ``y`` is bit for bit the plain activation kernels' (the same maths in
float32, rounded once); what the epilogue writes from ``y`` matches
``quant_epilogue.reference_emit(y)`` bit for bit, with or without ``y`` stored. Outputs are
poisoned first.
"""

import pytest
import torch

from fuseops.kernels.elementwise import activation as plain_kernels
from fuseops.kernels.elementwise import activation_quantize as kernels
from fuseops.kernels.elementwise import gated_activation as gated_kernels
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.quantization import epilogue as qe
from tests.helpers import DTYPES, assert_bitwise, assert_close_rel, cuda_or_skip
from tests.kernels.quantization.test_epilogue import FORMATS, poisoned_outputs

# Rows off the row tile; output widths below, across and off every block length.
SHAPES = [(3, 5), (19, 150), (0, 8)]
GATES = {
    "swiglu": dict(act=Activation.SILU),
    "geglu-interleaved-probs": dict(act=Activation.GELU_TANH, interleaved=True, probs=True),
    "clamped-swiglu-probs": dict(act=Activation.SILU, clamped=True, limit=7.0, alpha=1.702, probs=True),
}


def _gated(x, gate, probs, store_y, fmt, launch):
    kw = {k: v for k, v in GATES[gate].items() if k != "probs"}
    scaling, element = FORMATS[fmt]
    out = poisoned_outputs(x.shape[0], x.shape[1] // 2, x.dtype, x.device, scaling, element, store_y)
    return launch(x, probs=probs, scaling=scaling, element=element, store_y=store_y, out=out, **kw)


def _check(emitted, plain_y, make_without_y, fmt, exact):
    scaling, element = FORMATS[fmt]
    if exact:
        assert_bitwise(emitted.y, plain_y, "y")
    else:
        assert_close_rel(emitted.y, plain_y, plain_y.dtype, what="y")
    expected = qe.reference_emit(emitted.y, scaling=scaling, element=element, store_y=True)
    for name, got, want in zip(qe.Emitted._fields, emitted, expected):
        assert_bitwise(got, want, f"{fmt} {name}")
    without_y = make_without_y()
    assert without_y.y is None
    for name, got, want in zip(qe.Emitted._fields[1:], without_y[1:], expected[1:]):
        assert_bitwise(got, want, f"{fmt} {name} (y not stored)")


def _check_plain(x, act, fmt, exact=True):
    scaling, element = FORMATS[fmt]

    def run(store_y):
        out = poisoned_outputs(*x.shape, x.dtype, x.device, scaling, element, store_y)
        return kernels.activation_quantize_fwd(x, act, scaling=scaling, element=element, store_y=store_y, out=out)

    _check(run(True), plain_kernels.activation_fwd(x, act), lambda: run(False), fmt, exact)


def _check_gated(x, gate, fmt, exact=True):
    probs = torch.rand(x.shape[0], device=x.device) if GATES[gate].get("probs") else None
    kw = {k: v for k, v in GATES[gate].items() if k != "probs"}
    plain_y = gated_kernels.gated_fwd(x, probs=probs, **kw)
    emitted = _gated(x, gate, probs, True, fmt, kernels.gated_quantize_fwd)
    _check(emitted, plain_y, lambda: _gated(x, gate, probs, False, fmt, kernels.gated_quantize_fwd), fmt, exact)
    # The reference path: the same storage from the reference's own y.
    ref = _gated(x, gate, probs, True, fmt, kernels.reference_gated_quantize_fwd)
    assert_close_rel(ref.y, plain_y, x.dtype, what="reference y")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", [Activation.GELU, Activation.SRELU, Activation.SIGMOID], ids=lambda a: a.name)
def test_plain_matches_reference(act, fmt, dtype):
    for rows, n in SHAPES:
        x = (torch.randn(rows, n) * 3).to(dtype)
        _check_plain(x, act, fmt)
        ref = kernels.reference_activation_quantize_fwd(x, act, scaling=FORMATS[fmt][0], element=FORMATS[fmt][1], store_y=True)
        assert_close_rel(ref.y, plain_kernels.reference_activation_fwd(x, act), dtype, what="reference y")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("gate", GATES)
def test_gated_matches_reference(gate, fmt, dtype):
    for rows, n in SHAPES:
        _check_gated((torch.randn(rows, 2 * n) * 3).to(dtype), gate, fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("gate", GATES)
def test_gpu_large_bf16(gate, fmt):
    device = cuda_or_skip()
    x = (torch.randn(2000, 2 * 4096 + 6, device=device) * 3).to(torch.bfloat16)
    _check_gated(x, gate, fmt, exact=False)
    _check_plain(x, Activation.GELU_TANH, fmt, exact=False)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["tensor", "mx", "nvfp4"])
def test_gpu_one_column(fmt):
    """The sm_90 build where the epilogue's column count is 1 (Triton specialises it)."""
    device = cuda_or_skip()
    x = torch.randn(3, 2, device=device) * 3
    _check_plain(x[:, :1].contiguous(), Activation.GELU, fmt, exact=False)
    _check_gated(x, "swiglu", fmt, exact=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", [Activation.RELU, Activation.GELU], ids=lambda a: a.name)
def test_non_finite_and_max_values_match_reference(act, fmt, dtype):
    """The epilogue's scales come from finite values alone and its codes keep NaN/inf (and
    stay finite at the dtype's max) exactly as quantize's reference does."""
    fmax = torch.finfo(dtype).max
    x = (torch.randn(5, 64) * 3).to(dtype)
    x[0, 3], x[1, 40], x[2, 17] = float("nan"), float("inf"), -float("inf")
    x[3] = fmax
    x[4, ::2] = -fmax
    scaling, element = FORMATS[fmt]
    for store_y in (True, False):
        out = poisoned_outputs(*x.shape, x.dtype, x.device, scaling, element, store_y)
        emitted = kernels.activation_quantize_fwd(x, act, scaling=scaling, element=element, store_y=store_y, out=out)
        y = plain_kernels.activation_fwd(x, act)
        if store_y:
            # NaN != NaN: compared as equal_nan, the rest bit for bit.
            torch.testing.assert_close(emitted.y, y, rtol=0, atol=0, equal_nan=True)
        expected = qe.reference_emit(y, scaling=scaling, element=element, store_y=store_y)
        for name, got, want in zip(qe.Emitted._fields[1:], emitted[1:], expected[1:]):
            assert_bitwise(got, want, f"{fmt} {name}")
        if expected.row_amax is not None:
            assert torch.isfinite(expected.row_amax).all()
