import dataclasses

import pytest
import torch
import torch.nn.functional as F

from fuseops.kernels.elementwise import norm as kernels
from tests.helpers import DTYPES, REL_TOL, assert_close_rel, cuda_or_skip, near_max_row, poison_

# (3, 5) holds each row in one block; (19, 130) reads rows in chunks under the interpreter,
# and its row blocks outnumber the persistent programs.
SHAPES = [(1, 1), (3, 5), (19, 130), (0, 8)]
EPS = 1e-5
# Kinds: LayerNorm with and without bias, RMSNorm.
KINDS = ["layernorm", "layernorm-nobias", "rmsnorm"]


def _params(n, dtype, kind, device="cpu"):
    weight = (torch.randn(n, device=device) * 0.5 + 1).to(dtype)
    bias = (torch.randn(n, device=device) * 0.5).to(dtype) if kind == "layernorm" else None
    return weight, bias


def _check(x, dy, weight, bias, kind, zc, dtype):
    """Forward and backward launchers against their references, outputs poisoned first."""
    out = poison_(torch.empty_like(x))
    if kind == "rmsnorm":
        y, rstd = kernels.rmsnorm_fwd(x, weight, EPS, zc, out=out)
        y_ref, rstd_ref = kernels.reference_rmsnorm_fwd(x, weight, EPS, zc)
        grads = kernels.rmsnorm_bwd(dy, x, weight, rstd_ref, zc)
        grads_ref = kernels.reference_rmsnorm_bwd(dy, x, weight, rstd_ref, zc)
    else:
        y, mean, rstd = kernels.layernorm_fwd(x, weight, bias, EPS, zc, out=out)
        y_ref, mean_ref, rstd_ref = kernels.reference_layernorm_fwd(x, weight, bias, EPS, zc)
        assert mean.dtype == torch.float32
        assert_close_rel(mean, mean_ref, torch.float32, what="mean")
        has_bias = bias is not None
        grads = kernels.layernorm_bwd(dy, x, weight, mean_ref, rstd_ref, zc, has_bias=has_bias)
        grads_ref = kernels.reference_layernorm_bwd(dy, x, weight, mean_ref, rstd_ref, zc, has_bias=has_bias)
        assert (grads[2] is None) == (not has_bias)
    assert y is out and rstd.dtype == torch.float32
    assert_close_rel(y, y_ref, dtype, what="y")
    assert_close_rel(rstd, rstd_ref, torch.float32, what="rstd")
    for name, g, g_ref in zip(("dx", "dweight", "dbias"), grads, grads_ref):
        if g_ref is not None:
            assert g.dtype == dtype
            assert_close_rel(g, g_ref, dtype, what=name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zc", [False, True], ids=["gamma", "zero-centred"])
@pytest.mark.parametrize("kind", KINDS)
def test_launchers_match_reference(kind, zc, dtype):
    for rows, n in SHAPES:
        x = (torch.randn(rows, n) * 2 + 0.5).to(dtype)
        dy = torch.randn(rows, n).to(dtype)
        weight, bias = _params(n, dtype, kind)
        if zc:
            weight = weight - 1
        _check(x, dy, weight, bias, kind, zc, dtype)


def _textbook(kind, x, weight, bias, zc):
    """torch's LayerNorm and the RMSNorm formula, in float64."""
    scale = weight + 1 if zc else weight
    if kind == "rmsnorm":
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS) * scale
    return F.layer_norm(x, x.shape[-1:], scale, bias, EPS)


@pytest.mark.parametrize("zc", [False, True], ids=["gamma", "zero-centred"])
@pytest.mark.parametrize("kind", KINDS)
def test_reference_is_the_textbook_function(kind, zc):
    x64 = (torch.randn(37, 130, dtype=torch.float64) * 2 + 0.5).requires_grad_()
    dy = torch.randn(37, 130, dtype=torch.float64)
    weight, bias = (p.requires_grad_() if p is not None else None for p in _params(130, torch.float64, kind))
    _textbook(kind, x64, weight, bias, zc).backward(dy)
    y64 = _textbook(kind, x64.detach(), weight.detach(), None if bias is None else bias.detach(), zc)
    x, w = x64.detach(), weight.detach()
    tol = REL_TOL[torch.float64]
    if kind == "rmsnorm":
        y, rstd = kernels.reference_rmsnorm_fwd(x, w, EPS, zc)
        dx, dw = kernels.reference_rmsnorm_bwd(dy, x, w, rstd, zc)
        db = None
    else:
        b = None if bias is None else bias.detach()
        y, mean, rstd = kernels.reference_layernorm_fwd(x, w, b, EPS, zc)
        dx, dw, db = kernels.reference_layernorm_bwd(dy, x, w, mean, rstd, zc, has_bias=bias is not None)
    assert (y - y64).norm() <= tol * y64.norm()
    assert (dx - x64.grad).norm() <= tol * x64.grad.norm()
    assert (dw - weight.grad).norm() <= tol * weight.grad.norm()
    if bias is not None:
        assert (db - bias.grad).norm() <= tol * bias.grad.norm()


# Rows of magnitude 1e19 and more: their float32 squares pass 3.4e38 (torch.nn's norms give 0
# there). Beside them ordinary rows, whose values must not move. Row 6 is ``near_max_row``: its
# rstd is a subnormal (values to 2e38).
LARGE_ROWS = (1e19, 1e25, 1e30)
NEAR_MAX_ROW = 6


# (The chunked path's first, unscaled pass overflows on the way, in numpy's float32.)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("path", ["reference", "launcher"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_large_finite_rows_normalize_as_in_float64(kind, dtype, path):
    # One block, and rows read in chunks under the interpreter.
    _large_rows_case(kind, dtype, path, torch.device("cpu"), ((7, 5), (19, 130)))


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_large_finite_rows_on_cuda(kind, dtype):
    """The kernels' branch for rows whose squares overflow, compiled: one-block tiles of 1, 8
    and 16 warps and the capped 32-warp ones (RMSNorm at 8192 columns: ``_FORWARD_MAXNREG``),
    and the chunked path (9000 columns)."""
    _large_rows_case(kind, dtype, "launcher", cuda_or_skip(), ((7, 5), (7, 1024), (7, 4096), (7, 8192), (7, 9000)))


def _large_rows_case(kind, dtype, path, device, shapes):
    """Rows 0, 2, 4 of each shape scaled by ``LARGE_ROWS`` and row 6 near float32's maximum,
    against float64; the others bit for bit as without them."""
    for rows, n in shapes:
        base = torch.randn(rows, n, device=device) * 2 + 0.5
        x = base.clone()
        for i, magnitude in enumerate(LARGE_ROWS):
            x[2 * i] *= magnitude
        x[NEAR_MAX_ROW] = near_max_row(n, device)
        x, base = x.to(dtype), base.to(dtype)
        dy = torch.randn(rows, n, device=device).to(dtype)
        weight, bias = _params(n, dtype, kind, device)
        x64 = x.double().requires_grad_()
        w64 = weight.double().requires_grad_()
        b64 = None if bias is None else bias.double()
        y64 = _textbook(kind, x64, w64, b64, False)
        y64.backward(dy.double())
        if kind == "rmsnorm":
            fwd = kernels.reference_rmsnorm_fwd if path == "reference" else kernels.rmsnorm_fwd
            bwd = kernels.reference_rmsnorm_bwd if path == "reference" else kernels.rmsnorm_bwd
            y, rstd = fwd(x, weight, EPS)
            dx, dw = bwd(dy, x, weight, rstd)
            y_base = fwd(base, weight, EPS)[0]
        else:
            fwd = kernels.reference_layernorm_fwd if path == "reference" else kernels.layernorm_fwd
            bwd = kernels.reference_layernorm_bwd if path == "reference" else kernels.layernorm_bwd
            y, mean, rstd = fwd(x, weight, bias, EPS)
            dx, dw, _ = bwd(dy, x, weight, mean, rstd, has_bias=bias is not None)
            y_base = fwd(base, weight, bias, EPS)[0]
            mean64 = x.double().mean(1)
            assert_close_rel(mean, mean64, torch.float32, what="mean")
        rstd64 = torch.rsqrt((x.double() - (0 if kind == "rmsnorm" else mean64[:, None])).square().mean(1) + EPS)
        assert ((rstd.double() - rstd64).abs() <= REL_TOL[torch.float32] * rstd64).all(), "rstd"
        # The near-maximum row's dx is a subnormal (~rstd), which Triton 3.6's interpreter
        # converts to and from bfloat16 wrongly (5e-39 stores as 8.2e-39): checked on CUDA.
        interpreted_subnormals = dtype == torch.bfloat16 and path == "launcher" and device.type == "cpu"
        for i in range(rows):
            assert_close_rel(y[i], y64[i].detach(), dtype, what=f"y row {i}")
            if not (interpreted_subnormals and i == NEAR_MAX_ROW):
                assert_close_rel(dx[i], x64.grad[i], dtype, factor=4, what=f"dx row {i}")
        assert_close_rel(dw, w64.grad, dtype, factor=4, what="dweight")
        ordinary = [i for i in range(rows) if i not in (0, 2, 4, NEAR_MAX_ROW)]
        assert torch.equal(y[ordinary], y_base[ordinary]), "an ordinary row moved beside large ones"


def test_against_torch_in_low_precision():
    # The launcher in bf16 against torch's layer norm in float64 (the ops-level spec).
    x = torch.randn(19, 130).to(torch.bfloat16)
    weight, bias = _params(130, torch.bfloat16, "layernorm")
    y, _, _ = kernels.layernorm_fwd(x, weight, bias, EPS)
    assert_close_rel(y, F.layer_norm(x.double(), (130,), weight.double(), bias.double(), EPS), torch.bfloat16)


def _one_feature_is_exact(device, dtype):
    # One feature: x - mean is exactly 0, so y is the bias and dx is 0, exactly (as torch's
    # LayerNorm gives). A mean off by an ulp, times rstd = 1 / sqrt(eps), was not (the GPU's
    # approximate float32 division: dx ~1e-5).
    x = (torch.randn(6, 1, device=device) * 3 + 0.7).to(dtype)
    weight, bias = _params(1, dtype, "layernorm", device)
    y, mean, rstd = kernels.layernorm_fwd(x, weight, bias, EPS)
    assert torch.equal(y, bias.expand(6, 1)) and torch.equal(mean, x[:, 0].float())
    assert torch.allclose(rstd, torch.full_like(rstd, 1 / EPS**0.5))
    dy = torch.randn(6, 1, device=device).to(dtype)
    dx, dw, db = kernels.layernorm_bwd(dy, x, weight, mean, rstd)
    assert torch.equal(dx, torch.zeros_like(dx)) and torch.equal(dw, torch.zeros_like(dw))
    assert_close_rel(db, dy.double().sum(0), dtype)


def test_constant_rows_and_one_feature():
    _one_feature_is_exact(torch.device("cpu"), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_one_feature_is_exact(dtype):
    _one_feature_is_exact(cuda_or_skip(), dtype)


def test_parameter_grads_are_deterministic():
    # Several programs, so the partial rows go through the second stage.
    x = torch.randn(24, 40).to(torch.bfloat16)
    dy = torch.randn(24, 40).to(torch.bfloat16)
    weight, _ = _params(40, torch.bfloat16, "rmsnorm")
    _, rstd = kernels.rmsnorm_fwd(x, weight, EPS)
    first = kernels.rmsnorm_bwd(dy, x, weight, rstd)[1]
    assert torch.equal(first, kernels.rmsnorm_bwd(dy, x, weight, rstd)[1])


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 4096), (1000, 16384 + 3), (3, 65536)], ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_large_bf16(kind, shape):
    device = cuda_or_skip()
    x = torch.randn(shape, device=device).to(torch.bfloat16)
    dy = torch.randn(shape, device=device).to(torch.bfloat16)
    weight, bias = _params(shape[1], torch.bfloat16, kind, device)
    for zc in (False, True):
        _check(x, dy, weight, bias, kind, zc, torch.bfloat16)


@pytest.mark.parametrize("n", [1, 64, 1000, 4096, 8192])
def test_backward_gpu_tiles_hold_at_most_32_values_a_thread(n, monkeypatch):
    """The backward's GPU tiles (``_BACKWARD``, chosen on CPU too): at most 32 values of a tile
    per thread (64 spill from 4096 columns, for sm_90a), whole rows in one
    block up to 8192 columns; wider rows keep the forward's chunked tiles."""
    monkeypatch.setattr(kernels, "INTERPRET", False)
    kernels._configs.cache_clear()
    try:
        for rows in (1, 3, 4096):
            cfg = kernels._pick(rows, n, backward=True)
            assert cfg.one_block and cfg.block_m * cfg.block_n <= 32 * 32 * cfg.num_warps, cfg
        assert kernels._pick(16, 9000, backward=True) == dataclasses.replace(kernels._pick(16, 9000), maxnreg=0)
    finally:
        kernels._configs.cache_clear()


@pytest.mark.parametrize("n", [1, 64, 1000, 4096, 8192])
def test_forward_gpu_tiles_hold_at_most_8_values_a_thread(n, monkeypatch):
    """The forward's GPU tiles (chosen on CPU too): 8 values of a tile per thread
    at most (16 took 167-245 registers, offline for sm_90a), at most 32 warps, whole rows in
    one block up to 8192 columns."""
    monkeypatch.setattr(kernels, "INTERPRET", False)
    kernels._configs.cache_clear()
    try:
        for rows in (1, 3, 4096):
            cfg = kernels._pick(rows, n)
            assert cfg.one_block and cfg.block_m * cfg.block_n <= 8 * 32 * cfg.num_warps <= 8 * 32 * 32, cfg
    finally:
        kernels._configs.cache_clear()


@pytest.mark.parametrize("rms", [True, False])
def test_forward_register_caps_keep_programs_resident(rms, monkeypatch):
    """The forward's GPU configs (chosen on CPU too) carry ``_FORWARD_MAXNREG``'s caps: RMSNorm's
    one-block programs of 16 and 32 warps and every chunked program, at most the registers of a
    multiprocessor (65,536) over the threads it holds (three 16-warp programs, two of 32 warps);
    LayerNorm's one-block programs and every backward uncapped (``_FORWARD_MAXNREG``'s
    measurements)."""
    monkeypatch.setattr(kernels, "INTERPRET", False)
    kernels._configs.cache_clear()
    try:
        for n, resident in ((1024, 0), (4096, 3), (8192, 2), (16387, 2)):
            cfg = kernels._pick(4096, n, rms=rms)
            if resident and (rms or not cfg.one_block):
                assert cfg.maxnreg and cfg.maxnreg * 32 * cfg.num_warps * resident <= 65536, (n, cfg)
            else:
                assert cfg.maxnreg == 0, (n, cfg)
            assert kernels._pick(4096, n, backward=True, rms=rms).maxnreg == 0
    finally:
        kernels._configs.cache_clear()


def _nan_filled(empty):
    """``torch.empty`` whose float buffers come back NaN-filled."""

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    return nan_empty


def test_backward_partial_sums_need_no_zeroed_buffer(monkeypatch):
    """Every ``torch.empty`` comes back NaN-filled: a partial-sum row that some program left
    unwritten (one-block rows are stored whole, without a memset first) would reach dweight."""
    monkeypatch.setattr(torch, "empty", _nan_filled(torch.empty))
    # (40, 6): more row blocks than programs; (0, 8): programs with no rows at all.
    for rows, n in SHAPES + [(40, 6)]:
        for kind in KINDS:
            x = torch.randn(rows, n) * 2 + 0.5
            weight, bias = _params(n, torch.float32, kind)
            _check(x, torch.randn(rows, n), weight, bias, kind, False, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_backward_partial_sums_need_no_zeroed_buffer(kind, monkeypatch):
    device = cuda_or_skip()
    monkeypatch.setattr(torch, "empty", _nan_filled(torch.empty))
    # One block per row on the GPU up to 8192 features; (5000, 512) has more row blocks than
    # programs, (0, 64) programs with no rows; (7, 9000) the chunked path; (2049, 2048) and
    # (33, 8192) the backward's own tiles (two rows a tile, the last one short; one row of 8192).
    for rows, n in [(0, 64), (3, 1024), (5000, 512), (7, 9000), (2049, 2048), (33, 8192)]:
        x = torch.randn(rows, n, device=device) * 2 + 0.5
        weight, bias = _params(n, torch.float32, kind, device)
        _check(x, torch.randn(rows, n, device=device), weight, bias, kind, False, torch.float32)
