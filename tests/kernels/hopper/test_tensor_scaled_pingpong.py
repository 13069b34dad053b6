"""The ping-pong FP8 per-tensor grouped GEMM (Gluon, sm_90) against float64 and element by
element against the cooperative Gluon kernel and the Triton one: ragged groups (empty, one row,
across tile edges, one holding everything, many, so that both consumers meet short and long
walks), N and K tails, bias, E5M2 gradients (dgrad), and a CUDA graph replayed on other split
sizes. GPU only: Gluon does not run in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.hopper import tensor_scaled, tensor_scaled_pingpong
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantization.operand import Operand
from tests.helpers import HOPPER_SPLITS, SM90_ONLY, assert_close_rel, poison_
from tests.kernels.gemm.test_grouped_scaled import oracle_forward
from tests.kernels.hopper.test_tensor_scaled import (
    SHAPES,
    _rows,
    _triton,
    _weight,
    _with_bias,
    many_tiles_each,
    replays_on_new_split_sizes,
)

pytestmark = SM90_ONLY


@pytest.mark.parametrize("split", HOPPER_SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward(split, shape):
    K, N = SHAPES[shape]
    offsets, a = _rows(split, K, Element.E4M3)
    G = offsets.shape[0] - 1
    b = _weight(G, N, K)
    bias = torch.randn(G, N, device="cuda").to(torch.bfloat16)
    kw = {"scaling": Scaling.TENSOR, "out_dtype": torch.bfloat16, "bias": bias}
    out = poison_(torch.empty(a.data.shape[0], N, device="cuda", dtype=torch.bfloat16))
    y = tensor_scaled_pingpong.grouped_gemm_scaled(a, b, offsets, out=out, **kw)
    assert y is out
    assert_close_rel(y, _with_bias(oracle_forward(a, b, offsets, Scaling.TENSOR), bias, offsets), torch.bfloat16,
                     what=f"{split} {shape}")
    torch.testing.assert_close(y, tensor_scaled.grouped_gemm_scaled(a, b, offsets, **kw), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(y, _triton(a, b, offsets, torch.bfloat16, bias), rtol=1e-2, atol=1e-2)


def test_dgrad_e5m2_gradients():
    N, K = 208, 200
    offsets, dy = _rows("ragged", N, Element.E5M2)
    w = _weight(offsets.shape[0] - 1, N, K)
    b = Operand(w.data.transpose(1, 2), None, w.outer)
    y = tensor_scaled_pingpong.grouped_gemm_scaled(dy, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.float16)
    assert_close_rel(y, oracle_forward(dy, b, offsets, Scaling.TENSOR), torch.float16)
    torch.testing.assert_close(y, _triton(dy, b, offsets, torch.float16), rtol=1e-2, atol=1e-2)


def test_many_tiles_each():
    """Several tiles a program, so both consumers take turns, and a consumer's ring count jumps
    past the other's tile of more steps than stages."""
    many_tiles_each(tensor_scaled_pingpong.grouped_gemm_scaled)


def test_captures_in_a_cuda_graph():
    replays_on_new_split_sizes(tensor_scaled_pingpong.grouped_gemm_scaled)
