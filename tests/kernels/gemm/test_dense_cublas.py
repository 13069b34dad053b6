"""dense_cublas.gemm and gemm_gated (cuBLAS + one elementwise kernel) against the float64
references of the fused GEMMs they stand in for, every forward epilogue, the dgrad epilogues
and the gates; on CUDA beside the fused kernels themselves."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels._triton import interpreted_kernels
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.elementwise.gated_activation import reference_gated_fwd
from fuseops.kernels.gemm import dense, dense_cublas, dense_gated
from fuseops.kernels.gemm.dense import reference_gemm
from tests.helpers import assert_bitwise, assert_close_rel, capture_cuda_graph, cuda_or_skip, poison_

EPILOGUES = [
    dict(),
    dict(bias=True),
    *[dict(bias=True, act=act, save_preact=True) for act in Activation if act is not Activation.IDENTITY],
    dict(act=Activation.SILU, alpha=1.702),
    dict(bias=True, save_preact=True),
    dict(bias=True, residual=True),
    dict(residual=True, save_preact=True),
    dict(bias=True, act=Activation.RELU, residual=True, save_preact=True),
]


def _ids(epi: dict) -> str:
    return "+".join(f"{k}={v.name}" if isinstance(v, Activation) else k for k, v in epi.items()) or "plain"


def _args(m, k, n, dtype, device, epi):
    a = torch.randn(m, k, device=device).to(dtype)
    b = (torch.randn(n, k, device=device) / k**0.5).to(dtype).t()
    kw = dict(epi)
    if kw.pop("bias", False):
        kw["bias"] = torch.randn(n, device=device).to(dtype)
    if kw.pop("residual", False):
        kw["residual"] = torch.randn(m, n, device=device).to(dtype)
    return a, b, kw


def check(run, a, b, dtype, **epi):
    """``run``'s outputs against the float64 reference: values, dtypes, separate tensors."""
    y, preact = run(a, b, **epi)
    ref_epi = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in epi.items()}
    ref_y, ref_preact = reference_gemm(a.double(), b.double(), **ref_epi)
    assert y.dtype == dtype and y.shape == ref_y.shape
    assert_close_rel(y, ref_y, dtype, what="y")
    if epi.get("save_preact"):
        assert preact.dtype == dtype and preact.data_ptr() != y.data_ptr()
        assert_close_rel(preact, ref_preact, dtype, what="preact")
    else:
        assert preact is None
    return y, preact


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epi", EPILOGUES, ids=_ids)
def test_every_forward_epilogue_on_cpu(epi, dtype):
    a, b, kw = _args(37, 24, 70, dtype, "cpu", epi)
    residual = kw.get("residual")
    kept = None if residual is None else residual.clone()
    with interpreted_kernels():
        check(dense_cublas.gemm, a, b, dtype, **kw)
    if residual is not None:
        assert torch.equal(residual, kept)  # the residual is read, never written


def test_out_is_written():
    a, b, kw = _args(8, 16, 12, torch.float32, "cpu", dict(bias=True, residual=True))
    out = poison_(torch.empty(8, 12))
    y, _ = dense_cublas.gemm(a, b, out=out, **kw)
    assert y is out
    assert_close_rel(out, reference_gemm(a.double(), b.double(), bias=kw["bias"].double(),
                                         residual=kw["residual"].double())[0], torch.float32)


DGRAD_EPILOGUES = [dict(act=act, act_grad=True) for act in Activation if act is not Activation.IDENTITY] + [
    dict(act=Activation.SILU, alpha=1.702, act_grad=True), dict(residual=True)]


def _dgrad_args(m, k, n, dtype, device, epi):
    """``dy`` [m, k] and the forward's weight [k, n] as it is (the dgrad orientation)."""
    dy = torch.randn(m, k, device=device).to(dtype)
    w = (torch.randn(k, n, device=device) / k**0.5).to(dtype)
    kw = dict(epi)
    if kw.pop("act_grad", False):
        kw["act_grad_input"] = torch.randn(m, n, device=device).to(dtype)
    if kw.pop("residual", False):
        kw["residual"] = torch.randn(m, n, device=device).to(dtype)
    return dy, w, kw


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epi", DGRAD_EPILOGUES, ids=_ids)
@pytest.mark.parametrize("rows", [0, 37])
def test_every_dgrad_epilogue_on_cpu(epi, dtype, rows):
    dy, w, kw = _dgrad_args(rows, 24, 70, dtype, "cpu", epi)
    kept = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    with interpreted_kernels():
        check(dense_cublas.gemm, dy, w, dtype, **kw)
    for k, v in kept.items():
        assert torch.equal(kw[k], v), f"{k} was written"  # read, never written


def test_dgrad_propagates_non_finite_values_like_the_unfused_ops():
    dy, w, kw = _dgrad_args(8, 16, 12, torch.bfloat16, "cpu", dict(act=Activation.GELU_TANH, act_grad=True))
    dy[2, 5], kw["act_grad_input"][6, 1] = float("inf"), float("nan")
    with interpreted_kernels():
        dz, _ = dense_cublas.gemm(dy, w, **kw)
    want, _ = reference_gemm(dy.double(), w.double(), act=Activation.GELU_TANH,
                             act_grad_input=kw["act_grad_input"].double())
    assert torch.equal(torch.isnan(dz), torch.isnan(want)) and torch.equal(torch.isinf(dz), torch.isinf(want))
    finite = torch.isfinite(want)
    assert_close_rel(dz[finite], want[finite], torch.bfloat16, what="finite dz")


def test_empty_output():
    a, b, kw = _args(0, 16, 12, torch.bfloat16, "cpu", dict(bias=True, act=Activation.GELU, save_preact=True))
    y, preact = dense_cublas.gemm(a, b, **kw)
    assert y.shape == preact.shape == (0, 12)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 4096, 1024), (1000, 512, 2048)])
@pytest.mark.parametrize("epi", EPILOGUES, ids=_ids)
def test_both_branches_on_cuda(epi, shape):
    device = cuda_or_skip()
    dtype = torch.bfloat16
    a, b, kw = _args(*shape, dtype, device, epi)
    y_cublas, z_cublas = check(dense_cublas.gemm, a, b, dtype, **kw)
    y_fused, z_fused = check(dense.gemm, a, b, dtype, **kw)
    # One extra rounding of z to bf16 before the activation / the add: within bf16's step.
    assert_close_rel(y_cublas, y_fused.double(), dtype, what="cublas vs fused")
    if kw.get("save_preact"):
        assert_close_rel(z_cublas, z_fused.double(), dtype, what="preact cublas vs fused")


_GATES = {
    "swiglu": dict(act=Activation.SILU),
    "geglu_interleaved": dict(act=Activation.GELU_TANH, interleaved=True),
    "clamped_swiglu": dict(act=Activation.SILU, clamped=True, limit=0.5, alpha=1.702),
}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("gate", list(_GATES))
@pytest.mark.parametrize("rows", [0, 1, 37])
def test_cublas_gated_branch_is_the_unfused_linear_then_gate(rows, gate, bias):
    """``dense_cublas.gemm_gated`` computes what the unfused ops do: ``z`` as the Linear's
    product rounded to bf16, then the gate on that ``z``; the gate against float64."""
    a, b, kw = _args(rows, 24, 48, torch.bfloat16, "cpu", dict(bias=True))
    b_vec = kw["bias"]
    epi = dict(bias=b_vec if bias else None, **_GATES[gate])
    with interpreted_kernels():
        y, z = dense_cublas.gemm_gated(a, b, save_preact=True, **epi)
        out = torch.full((rows, 24), float("nan"), dtype=torch.bfloat16)
        y_out, none = dense_cublas.gemm_gated(a, b, out=out, **epi)
    linear = torch.nn.functional.linear(a, b.t(), epi["bias"])
    assert_bitwise(z, linear, "preact")
    assert none is None and y_out is out
    assert_bitwise(y_out, y, "y written into out")
    gate_args = {k: v for k, v in epi.items() if k != "bias"}
    assert_close_rel(y, reference_gated_fwd(z.double(), **gate_args), torch.bfloat16, what="y")
    assert y.shape == (rows, 24) and y.dtype == torch.bfloat16


def test_cublas_gated_branch_propagates_non_finite_values_like_the_unfused_ops():
    a, b, kw = _args(8, 16, 32, torch.bfloat16, "cpu", dict(bias=True))
    bias = kw["bias"]
    a[1, 3], a[5, 0], bias[20] = float("inf"), float("nan"), float("-inf")
    epi = dict(bias=bias, act=Activation.SILU)
    with interpreted_kernels():
        y, _ = dense_cublas.gemm_gated(a, b, **epi)
    want = reference_gated_fwd(torch.nn.functional.linear(a, b.t(), bias).double(), Activation.SILU)
    assert torch.equal(torch.isnan(y), torch.isnan(want)) and torch.equal(torch.isinf(y), torch.isinf(want))
    finite = torch.isfinite(want)
    assert_close_rel(y[finite], want[finite], torch.bfloat16, what="finite y")


@pytest.mark.gpu
@pytest.mark.parametrize("save_preact", [False, True])
@pytest.mark.parametrize("gate", list(_GATES))
@pytest.mark.parametrize("shape", [(64, 4096, 2048), (1000, 512, 4096)])
def test_both_gated_branches_on_cuda(shape, gate, save_preact):
    device = cuda_or_skip()
    a, b, kw = _args(*shape, torch.bfloat16, device, dict(bias=True))
    epi = dict(bias=kw["bias"], save_preact=save_preact, **_GATES[gate])
    y_cublas, z_cublas = dense_cublas.gemm_gated(a, b, **epi)
    y_fused, z_fused = dense_gated.gemm_gated(a, b, **epi)
    gate_args = {k: v for k, v in epi.items() if k not in ("bias", "save_preact")}
    want = reference_gated_fwd(torch.addmm(kw["bias"].double(), a.double(), b.double()), **gate_args)
    for y, what in ((y_cublas, "cublas"), (y_fused, "fused")):
        assert_close_rel(y, want, torch.bfloat16, what=f"{what} y against float64")
    if save_preact:
        assert_bitwise(z_cublas, torch.addmm(kw["bias"], a, b), "cublas preact")
        assert_close_rel(z_fused, z_cublas.double(), torch.bfloat16, what="fused preact")
    else:
        assert z_cublas is None and z_fused is None


@pytest.mark.gpu
@pytest.mark.parametrize("epi", DGRAD_EPILOGUES, ids=_ids)
def test_both_dgrad_branches_on_cuda(epi):
    device = cuda_or_skip()
    dy, w, kw = _dgrad_args(1000, 512, 2048, torch.bfloat16, device, epi)
    y_cublas, _ = check(dense_cublas.gemm, dy, w, torch.bfloat16, **kw)
    y_fused, _ = check(dense.gemm, dy, w, torch.bfloat16, **kw)
    assert_close_rel(y_cublas, y_fused.double(), torch.bfloat16, what="cublas vs fused")


@pytest.mark.gpu
def test_cuda_graph_capture():
    device = cuda_or_skip()
    a, b, kw = _args(64, 256, 512, torch.bfloat16, device, dict(bias=True, act=Activation.GELU_TANH, save_preact=True))
    graph, (y, z) = capture_cuda_graph(lambda: dense_cublas.gemm(a, b, **kw))
    a.copy_(torch.randn_like(a))
    graph.replay()
    want_y, want_z = dense_cublas.gemm(a, b, **kw)
    assert torch.equal(y, want_y) and torch.equal(z, want_z)
