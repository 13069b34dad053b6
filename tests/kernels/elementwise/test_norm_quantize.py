"""Norms with the quantize epilogue against their references, through the interpreter.

The high-precision ``y`` and the statistics match the reference within the dtype's tolerance
(as elementwise/norm.py's kernels do); what the epilogue writes from ``y`` matches
``quant_epilogue.reference_emit(y)`` bit for bit, with or without ``y`` stored. Outputs are
poisoned first.
"""

import pytest
import torch

from fuseops.kernels.elementwise import norm_quantize as kernels
from fuseops.kernels.elementwise.norm import forward_maxnreg
from fuseops.kernels.quantization import epilogue as qe
from fuseops.kernels.quantization.formats import Scaling
from tests.helpers import DTYPES, assert_bitwise, assert_close_rel, cuda_or_skip, near_max_row
from tests.kernels.elementwise.test_norm import _textbook
from tests.kernels.quantization.test_epilogue import FORMATS, poisoned_outputs

# (3, 5) holds each row in one block; (19, 200) reads rows in chunks under the interpreter
# (MX, NVFP4) and has a partial last block; (0, 8) has no rows.
SHAPES = [(3, 5), (19, 200), (0, 8)]
EPS = 1e-5
KINDS = ["layernorm", "layernorm-nobias", "rmsnorm"]
# The recipes' input formats (the E5M2 variants run the same epilogue: test_activation_quantize).
NORM_FORMATS = ["tensor", "block", "mx", "nvfp4"]


def _run(x, weight, bias, kind, zc, scaling, element, store_y, launch_kernel=True):
    args = {"scaling": scaling, "element": element, "store_y": store_y}
    if launch_kernel:
        args["out"] = poisoned_outputs(*x.shape, x.dtype, x.device, scaling, element, store_y)
    if kind == "rmsnorm":
        launch = kernels.rmsnorm_quantize_fwd if launch_kernel else kernels.reference_rmsnorm_quantize_fwd
        emitted, rstd = launch(x, weight, EPS, zc, **args)
        return emitted, None, rstd
    launch = kernels.layernorm_quantize_fwd if launch_kernel else kernels.reference_layernorm_quantize_fwd
    return launch(x, weight, bias, EPS, zc, **args)


def _check(x, weight, bias, kind, zc, fmt):
    scaling, element = FORMATS[fmt]
    dtype = x.dtype
    emitted, mean, rstd = _run(x, weight, bias, kind, zc, scaling, element, True)
    ref, mean_ref, rstd_ref = _run(x, weight, bias, kind, zc, scaling, element, True, launch_kernel=False)
    assert_close_rel(emitted.y, ref.y, dtype, what="y")
    assert_close_rel(rstd, rstd_ref, torch.float32, what="rstd")
    if mean_ref is not None:
        assert_close_rel(mean, mean_ref, torch.float32, what="mean")
    # The epilogue quantizes the y it stored: exactly what the reference makes of that y.
    expected = qe.reference_emit(emitted.y, scaling=scaling, element=element, store_y=True)
    for name, got, want in zip(qe.Emitted._fields, emitted, expected):
        assert_bitwise(got, want, f"{kind} {fmt} {name}")
    without_y, _, _ = _run(x, weight, bias, kind, zc, scaling, element, False)
    assert without_y.y is None
    for name, got, want in zip(qe.Emitted._fields[1:], without_y[1:], expected[1:]):
        assert_bitwise(got, want, f"{kind} {fmt} {name} (y not stored)")


def _inputs(rows, n, dtype, kind, zc, device="cpu"):
    x = (torch.randn(rows, n, device=device) * 2 + 0.5).to(dtype)
    weight = (torch.randn(n, device=device) * 0.5 + (0 if zc else 1)).to(dtype)
    bias = (torch.randn(n, device=device) * 0.5).to(dtype) if kind == "layernorm" else None
    return x, weight, bias


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", NORM_FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_launchers_match_reference(kind, fmt, dtype):
    # Zero-centred gamma once per format and dtype: it only changes the loaded scale.
    zc = kind == "layernorm-nobias"
    for rows, n in SHAPES:
        _check(*_inputs(rows, n, dtype, kind, zc), kind, zc, fmt)


# (The chunked path's first, unscaled pass overflows on the way, in numpy's float32.)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("fmt", ["tensor", "mx"])
@pytest.mark.parametrize("kind", KINDS)
def test_large_finite_rows_match_reference(kind, fmt):
    """Rows of 1e19 and 1e30 (their float32 squares overflow) and one near float32's maximum (its
    rstd a subnormal) beside ordinary ones: y as float64's (test_norm.py has the statistics and
    gradients), the statistics as the reference's, every epilogue output its bit-for-bit
    quantization."""
    _large_rows_case(kind, fmt, torch.device("cpu"), [(5, 5), (19, 200)])


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("fmt", ["tensor", "mx"])
@pytest.mark.parametrize("kind", KINDS)
def test_large_finite_rows_on_cuda(kind, fmt):
    """The branch for rows whose squares overflow, compiled: one-block tiles of 1, 8 and 32 warps
    (RMSNorm's capped at 8192 columns) and the chunked path (9000 columns)."""
    _large_rows_case(kind, fmt, cuda_or_skip(), [(5, 5), (7, 1024), (6, 8192), (7, 9000)])


def _large_rows_case(kind, fmt, device, shapes):
    scaling, element = FORMATS[fmt]
    for rows, n in shapes:
        x, weight, bias = _inputs(rows, n, torch.float32, kind, False, device)
        x[0] *= 1e19
        x[2] *= 1e30
        x[4] = near_max_row(n, device)
        _check(x, weight, bias, kind, False, fmt)
        emitted, _, _ = _run(x, weight, bias, kind, False, scaling, element, True)
        assert_close_rel(emitted.y, _textbook(kind, x.double(), weight.double(),
                                              None if bias is None else bias.double(), False), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 4096), (1000, 16384 + 3)], ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_large_bf16(kind, fmt, shape):
    device = cuda_or_skip()
    _check(*_inputs(*shape, torch.bfloat16, kind, False, device), kind, False, fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["tensor", "mx", "nvfp4"])
def test_gpu_one_column(fmt):
    """The sm_90 build where the row length is 1 (Triton specialises it)."""
    device = cuda_or_skip()
    _check(*_inputs(3, 1, torch.float32, "rmsnorm", False, device), "rmsnorm", False, fmt)


@pytest.mark.parametrize("rms", [True, False])
def test_forward_register_caps_follow_the_norm_forward(rms, monkeypatch):
    """The norm + quantize forward's GPU configs take the norm forward's register caps
    (``norm.forward_maxnreg``) for their warps and path."""
    monkeypatch.setattr(kernels, "INTERPRET", False)
    kernels._configs.cache_clear()
    try:
        for n in (1024, 4096, 8192, 16387):
            cfg = kernels._pick(4096, n, Scaling.TENSOR, rms=rms)
            assert cfg.maxnreg == forward_maxnreg(cfg.num_warps, cfg.one_block, rms), (n, cfg)
        assert kernels._pick(4096, 8192, Scaling.TENSOR, rms=True).maxnreg == 32
    finally:
        kernels._configs.cache_clear()
