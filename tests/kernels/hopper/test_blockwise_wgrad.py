"""The warp-specialized FP8 blockwise grouped wgrad (Gluon, sm_90) element by element
against the Triton kernel it replaces, written (empty groups come out zero) and into
main_grad, over ragged groups and N / K tails. GPU only: Gluon does not run in Triton's
interpreter.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.gemm.grouped_scaled_wgrad import launch_grouped_gemm_scaled_wgrad, pick_wgrad_config
from fuseops.kernels.hopper import blockwise as hopper
from fuseops.kernels.hopper.blockwise_wgrad import grouped_blockwise_wgrad
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantization.operand import Operand
from tests.helpers import SM90_ONLY, dispatched, poison_
from tests.kernels.hopper.test_blockwise import SHAPES, SPLITS, _rows

# The launchers as ops reach them: through the dispatch table (the Gluon kernels on sm_90).
grouped_gemm_scaled_wgrad = dispatched(Kernel.GROUPED_GEMM_SCALED_WGRAD)

pytestmark = SM90_ONLY


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_wgrad(split, shape, accumulate):
    K, N = SHAPES[shape]
    offsets, x = _rows(split, K, Element.E4M3)
    _, dy = _rows(split, N, Element.E5M2)
    G = offsets.shape[0] - 1
    a, b = Operand(dy.data_t[0], dy.scale_t[0]), Operand(x.data_t[0], x.scale_t[0])
    assert hopper.usable(a.data, b.data)
    cfg = pick_wgrad_config(Scaling.BLOCK, accumulate)
    if accumulate:
        main_grad = torch.randn(G, N, K, device="cuda")
        expected = main_grad.clone()
        launch_grouped_gemm_scaled_wgrad(a, b, offsets, Scaling.BLOCK, torch.float32, expected, None, cfg)
        got = grouped_gemm_scaled_wgrad(a, b, offsets, scaling=Scaling.BLOCK, out_dtype=torch.bfloat16,
                                        main_grad=main_grad)
        assert got is main_grad
    else:
        expected = launch_grouped_gemm_scaled_wgrad(a, b, offsets, Scaling.BLOCK, torch.float32, None, None, cfg)
        out = poison_(torch.empty(G, N, K, device="cuda"))
        got = grouped_gemm_scaled_wgrad(a, b, offsets, scaling=Scaling.BLOCK, out_dtype=torch.float32, out=out)
        assert got is out
        empty = [g for g, s in enumerate(SPLITS[split]) if s == 0]
        assert (got[empty] == 0).all()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("accumulate", [False, True])
def test_both_walk_orders_write_the_same_sums(accumulate):
    """Walked along K first and along N first (gemm/wgrad_walk.py): every tile written, the same
    sums bit for bit, and those of the Triton kernel."""
    K, N = SHAPES["tails"]
    offsets, x = _rows("ragged", K, Element.E4M3)
    _, dy = _rows("ragged", N, Element.E5M2)
    G = offsets.shape[0] - 1
    a, b = Operand(dy.data_t[0], dy.scale_t[0]), Operand(x.data_t[0], x.scale_t[0])
    start = torch.randn(G, N, K, device="cuda")
    dws = [grouped_blockwise_wgrad(a, b, offsets, start.clone() if accumulate else poison_(torch.empty_like(start)),
                                   accumulate, along_n) for along_n in (False, True)]
    expected = launch_grouped_gemm_scaled_wgrad(a, b, offsets, Scaling.BLOCK, torch.float32,
                                                start.clone() if accumulate else None, None,
                                                pick_wgrad_config(Scaling.BLOCK, accumulate))
    torch.testing.assert_close(dws[1], expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(dws[0], dws[1])
