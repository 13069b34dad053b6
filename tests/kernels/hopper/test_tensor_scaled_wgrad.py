"""The warp-specialized FP8 per-tensor grouped wgrad (Gluon, sm_90) element by element against
the Triton kernel it replaces and against float64: written in bf16 (empty groups come out zero)
and added into a float32 main_grad, over ragged groups and N / K tails, both walk orders, which
calls it serves, and a CUDA graph replayed on other split sizes. GPU only: Gluon does not run
in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_scaled_wgrad import (
    launch_grouped_gemm_scaled_wgrad,
    pick_wgrad_config,
    reference_grouped_gemm_scaled_wgrad,
)
from fuseops.kernels.hopper import tensor_scaled_wgrad as hopper
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantization.operand import Operand
from tests.helpers import HOPPER_SPLITS, SM90_ONLY, assert_close_rel, poison_
from tests.kernels.gemm.test_grouped_scaled import quantized
from tests.kernels.hopper.test_tensor_scaled import SHAPES

pytestmark = SM90_ONLY


def _columns(sizes: list[int], C: int, element: Element) -> tuple[torch.Tensor, Operand]:
    """Rows grouped by ``sizes`` quantized per group; their column-wise copy [C, P] (padded
    grouped layout) with the groups' scales."""
    offsets = group_offsets(torch.tensor(sizes, device="cuda"))
    bufs, outer = quantized(torch.randn(1, sum(sizes), C, device="cuda"), offsets, len(sizes), Scaling.TENSOR,
                            element)
    return offsets, Operand(bufs.data_t[0], None, outer)


def _operands(split: str, shape: str) -> tuple[torch.Tensor, Operand, Operand]:
    K, N = SHAPES[shape]
    torch.manual_seed(0)
    offsets, b = _columns(HOPPER_SPLITS[split], K, Element.E4M3)
    _, a = _columns(HOPPER_SPLITS[split], N, Element.E5M2)
    return offsets, a, b


def _triton(a: Operand, b: Operand, offsets: torch.Tensor, out_dtype: torch.dtype, main_grad=None) -> torch.Tensor:
    cfg = pick_wgrad_config(Scaling.TENSOR, main_grad is not None)
    return launch_grouped_gemm_scaled_wgrad(a, b, offsets, Scaling.TENSOR, out_dtype, main_grad, None, cfg)


@pytest.mark.parametrize("split", HOPPER_SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_wgrad(split, shape, accumulate):
    offsets, a, b = _operands(split, shape)
    G, N, K = offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0]
    kw = {"scaling": Scaling.TENSOR, "out_dtype": torch.bfloat16}
    oracle = reference_grouped_gemm_scaled_wgrad(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.float32)
    if accumulate:
        main_grad = torch.randn(G, N, K, device="cuda")
        start = main_grad.clone()
        assert hopper.serves(a, b, offsets, main_grad=main_grad, **kw)
        got = hopper.grouped_gemm_scaled_wgrad(a, b, offsets, main_grad=main_grad, **kw)
        assert got is main_grad
        expected = _triton(a, b, offsets, torch.float32, start.clone())
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        assert_close_rel(got - start, oracle.double(), torch.float32, 100.0, what=f"{split} {shape}")
    else:
        out = poison_(torch.empty(G, N, K, device="cuda", dtype=torch.bfloat16))
        assert hopper.serves(a, b, offsets, out=out, **kw)
        got = hopper.grouped_gemm_scaled_wgrad(a, b, offsets, out=out, **kw)
        assert got is out
        empty = [g for g, s in enumerate(HOPPER_SPLITS[split]) if s == 0]
        assert (got[empty] == 0).all()
        torch.testing.assert_close(got, _triton(a, b, offsets, torch.bfloat16), rtol=1e-2, atol=1e-2)
        assert_close_rel(got, oracle.double(), torch.bfloat16, what=f"{split} {shape}")


@pytest.mark.parametrize("accumulate", [False, True])
def test_both_walk_orders_write_the_same_sums(accumulate):
    """Walked along K first and along N first (gemm/wgrad_walk.py): every tile written, the same
    sums bit for bit."""
    offsets, a, b = _operands("ragged", "tails")
    G, N, K = offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0]
    start = torch.randn(G, N, K, device="cuda")
    dtype = torch.float32 if accumulate else torch.bfloat16
    dws = [hopper.grouped_tensor_scaled_wgrad(
        a, b, offsets, start.clone() if accumulate else poison_(torch.empty(G, N, K, device="cuda", dtype=dtype)),
        accumulate, along_n=along_n) for along_n in (False, True)]
    assert torch.equal(dws[0], dws[1])


def test_what_it_serves():
    """Per-tensor FP8 with TMA-ready operands, written in bf16 / fp16 or added to float32; not a
    float32 dw written (the Triton kernel's), other formats or per-row scales."""
    offsets, a, b = _operands("ragged", "even")
    serves = hopper.serves
    assert serves(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.bfloat16)
    assert serves(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.float32,
                  main_grad=torch.zeros(offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0], device="cuda"))
    assert not serves(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.float32)
    assert not serves(a, b, offsets, scaling=Scaling.BLOCK, out_dtype=torch.bfloat16)
    per_row = Operand(a.data, None, torch.ones(a.data.shape[0], device="cuda"), outer_per_row=True)
    assert not serves(per_row, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.bfloat16)


def test_captures_in_a_cuda_graph():
    """No host sync: it replays in a CUDA graph with new split sizes (the same padded layout's
    positions, other groups' sums)."""
    offsets, a, b = _operands("ragged", "even")

    def run() -> torch.Tensor:
        return hopper.grouped_gemm_scaled_wgrad(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.bfloat16)

    eager = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    # Group 0's rows handed to group 1: its positions in the padded layout are group 0's, so
    # group 1 now sums them (group 1 held none) and group 0 is empty.
    sizes = HOPPER_SPLITS["ragged"]
    offsets.copy_(group_offsets(torch.tensor([0, sizes[0]] + sizes[2:], device="cuda")))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run())
    assert not torch.equal(captured, eager)
