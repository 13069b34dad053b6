"""What torch.compile traces for the dense GEMMs (gemm/traced.py): the product in the
operands' bf16 / fp16 (never a float32 GEMM of half operands), the epilogue of the reference."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs

import fuseops
from fuseops import ops
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import dense, dense_gated, traced


def _operands(M=24, K=40, N=32, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g).to(dtype)
    b = (torch.randn(N, K, generator=g) / K**0.5).to(dtype).t()
    bias = torch.randn(N, generator=g).to(dtype)
    return a, b, bias


@pytest.mark.parametrize("epilogue", ["bias+gelu", "residual", "act_grad", "preact"])
def test_gemm_is_the_reference_within_bf16(epilogue: str) -> None:
    a, b, bias = _operands()
    kw: dict = {"bias": bias, "act": Activation.GELU_TANH}
    if epilogue == "residual":
        kw = {"bias": bias, "residual": torch.randn(24, 32).bfloat16()}
    elif epilogue == "act_grad":
        kw["act_grad_input"] = torch.randn(24, 32).bfloat16()
    elif epilogue == "preact":
        kw["save_preact"] = True
    y, pre = traced.gemm(a, b, **kw)
    # The spec in float64: the traced product differs by one bf16 rounding of z.
    wide = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    y_ref, pre_ref = dense.reference_gemm(a.double(), b.double(), **wide)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), y_ref, rtol=2e-2, atol=2e-2)
    if epilogue == "preact":
        torch.testing.assert_close(pre.double(), pre_ref, rtol=1e-2, atol=1e-2)
    else:
        assert pre is None


def test_gemm_gated_is_the_reference_within_bf16() -> None:
    a, b, bias = _operands(N=48)
    y, pre = traced.gemm_gated(a, b, bias=bias, act=Activation.SILU, save_preact=True)
    y_ref, pre_ref = dense_gated.reference_gemm_gated(a.double(), b.double(), bias=bias.double(),
                                                      act=Activation.SILU, save_preact=True)
    assert y.shape == (24, 24) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), y_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(pre.double(), pre_ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_wide_operands_go_to_the_reference_unchanged(dtype: torch.dtype) -> None:
    a, b, bias = _operands(dtype=dtype)
    got = traced.gemm(a, b, bias=bias, act=Activation.GELU_TANH, save_preact=True)
    want = dense.reference_gemm(a, b, bias=bias, act=Activation.GELU_TANH, save_preact=True)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def _float32_products(graphs: list[torch.fx.GraphModule]) -> list[str]:
    found = []
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                vals = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
                if any(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in vals):
                    found.append(node.format_node())
    return found


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_a_compiled_bf16_model_multiplies_in_bf16(act: str) -> None:
    """Forward and backward graphs: every GEMM of the bf16 model takes bf16 operands."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    H = 32
    mid = (ops.GELU(approximate="tanh"),) if act == "gelu" else (ops.SwiGLU(),)
    fc1 = ops.Linear(H, 4 * H if act == "gelu" else 8 * H)
    model = fuseops.Sequential(ops.RMSNorm(H), fc1, *mid, ops.Linear(4 * H, H), ops.AddExtraInput()).bfloat16()
    x = torch.randn(16, H, dtype=torch.bfloat16, requires_grad=True)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(lambda t: model(t, t), backend=backend, fullgraph=True)
    compiled(x).float().sum().backward()
    assert backend.fw_graphs and backend.bw_graphs
    assert _float32_products(backend.fw_graphs + backend.bw_graphs) == []
