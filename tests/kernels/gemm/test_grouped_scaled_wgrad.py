"""grouped_gemm_scaled_wgrad against float64 in every format, over split sizes with empty
groups and groups across tile edges (operands from gemm/test_grouped_scaled.py's reference
quantizer: dy and x column-wise in the padded grouped layout), written and into main_grad, and
its Triton kernel under both tile walks.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.gemm.dense_scaled import reference_operand
from fuseops.kernels.gemm.grouped_scaled_wgrad import (
    grouped_gemm_scaled_wgrad,
    launch_grouped_gemm_scaled_wgrad,
    pick_wgrad_config,
    reference_grouped_gemm_scaled_wgrad,
)
from fuseops.kernels.quantization.grouped_layout import group_positions
from fuseops.kernels.quantization.operand import Operand
from tests.helpers import REL_TOL, assert_close_rel, groups_far_apart, poison_, rel_err
from tests.kernels.gemm.test_grouped_scaled import CASES, DEVICE, LAYOUTS, SPLITS, factor, make


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("split, shape", LAYOUTS)
def test_wgrad_matches_reference(case, split, shape):
    scaling, offsets, ops = make(case, split, shape)
    a, b = ops["dy_t"], ops["x_t"]
    G = offsets.shape[0] - 1
    out = poison_(torch.empty(G, a.data.shape[0], b.data.shape[0], device=DEVICE))
    dw = grouped_gemm_scaled_wgrad(a, b, offsets, scaling=scaling, out_dtype=torch.float32, out=out)
    assert dw is out
    A = reference_operand(Operand(a.data, a.scale), scaling).double()
    B = reference_operand(Operand(b.data, b.scale), scaling).double()
    pos, bounds = group_positions(offsets, int(offsets[-1])), offsets.tolist()
    expected = torch.zeros_like(dw, dtype=torch.float64)
    for g in range(G):
        p = pos[bounds[g]:bounds[g + 1]]
        outer = a.outer[g].double() * b.outer[g].double() if a.outer is not None else 1.0
        expected[g] = A[:, p] @ B[:, p].T * outer
    assert_close_rel(dw, expected, torch.float32, factor(scaling), what=f"{case} {split} {shape}")
    ref = reference_grouped_gemm_scaled_wgrad(a, b, offsets, scaling=scaling, out_dtype=torch.float32)
    assert rel_err(ref, expected) < REL_TOL[torch.float32]
    empty = [g for g, s in enumerate(SPLITS[split]) if s == 0]
    assert (dw[empty] == 0).all()


@pytest.mark.parametrize("case", ["tensor", "block"])
def test_wgrad_walk_orders_agree(case):
    """The Triton kernel walked along K first and along N first (gemm/wgrad_walk.py): every tile
    written, with the same sums bit for bit."""
    scaling, offsets, ops = make(case, "mixed", "aligned")
    a, b = ops["dy_t"], ops["x_t"]
    shape = (offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0])
    cfg = pick_wgrad_config(scaling, False)
    dws = [launch_grouped_gemm_scaled_wgrad(a, b, offsets, scaling, torch.float32, None,
                                            poison_(torch.empty(shape, device=DEVICE)), cfg, along_n)
           for along_n in (False, True)]
    ref = reference_grouped_gemm_scaled_wgrad(a, b, offsets, scaling=scaling, out_dtype=torch.float32)
    assert_close_rel(dws[1], ref.double(), torch.float32, factor(scaling), what=case)
    assert torch.equal(dws[0], dws[1])


@pytest.mark.parametrize("case", ["tensor", "nvfp4"])
def test_wgrad_main_grad(case):
    scaling, offsets, ops = make(case, "mixed", "aligned")
    a, b = ops["dy_t"], ops["x_t"]
    main_grad = torch.randn(offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0], device=DEVICE)
    expected = main_grad.double() + reference_grouped_gemm_scaled_wgrad(
        a, b, offsets, scaling=scaling, out_dtype=torch.float32).double()
    got = grouped_gemm_scaled_wgrad(a, b, offsets, scaling=scaling, out_dtype=torch.bfloat16, main_grad=main_grad)
    assert got is main_grad
    assert_close_rel(got, expected, torch.float32, factor(scaling), what=case)


def test_wgrad_into_groups_past_32_bit_offsets():
    """A float32 dw whose last group starts past 2**31 elements (the size of DeepSeek-V3's
    expert weight gradients): each group's sum lands in its own group."""
    scaling, offsets, ops = make("tensor", "mixed", "aligned")
    a, b = ops["dy_t"], ops["x_t"]
    out = groups_far_apart(offsets.shape[0] - 1, a.data.shape[0], b.data.shape[0], torch.float32, DEVICE)
    dw = grouped_gemm_scaled_wgrad(a, b, offsets, scaling=scaling, out_dtype=torch.float32, out=out)
    ref = reference_grouped_gemm_scaled_wgrad(a, b, offsets, scaling=scaling, out_dtype=torch.float32)
    assert dw is out
    assert_close_rel(dw, ref.double(), torch.float32, factor(scaling), what="dw")
