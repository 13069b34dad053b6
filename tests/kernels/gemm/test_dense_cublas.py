"""dense_cublas.gemm (cuBLAS + one elementwise kernel) against the float64 reference of the
fused GEMM it stands in for, every forward epilogue; on CUDA beside the fused kernel itself."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels._triton import interpreted_kernels
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import dense, dense_cublas
from fuseops.kernels.gemm.dense import reference_gemm
from tests.helpers import assert_close_rel, capture_cuda_graph, cuda_or_skip, poison_

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


def test_out_is_written_and_act_grad_input_is_refused():
    a, b, kw = _args(8, 16, 12, torch.float32, "cpu", dict(bias=True, residual=True))
    out = poison_(torch.empty(8, 12))
    y, _ = dense_cublas.gemm(a, b, out=out, **kw)
    assert y is out
    assert_close_rel(out, reference_gemm(a.double(), b.double(), bias=kw["bias"].double(),
                                         residual=kw["residual"].double())[0], torch.float32)
    with pytest.raises(ValueError, match="act_grad_input"):
        dense_cublas.gemm(a, b, act=Activation.GELU, act_grad_input=torch.randn(8, 12))


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


@pytest.mark.gpu
def test_cuda_graph_capture():
    device = cuda_or_skip()
    a, b, kw = _args(64, 256, 512, torch.bfloat16, device, dict(bias=True, act=Activation.GELU_TANH, save_preact=True))
    graph, (y, z) = capture_cuda_graph(lambda: dense_cublas.gemm(a, b, **kw))
    a.copy_(torch.randn_like(a))
    graph.replay()
    want_y, want_z = dense_cublas.gemm(a, b, **kw)
    assert torch.equal(y, want_y) and torch.equal(z, want_z)
