"""grouped_gemm_scaled (forward / dgrad) against its reference in float64 (and, on GPU at a
larger size, grouped_gemm_scaled_wgrad too; its own tests are gemm/test_grouped_scaled_wgrad.py), over split sizes with empty groups and groups across tile edges.

Operands come from the reference quantizer: x and dy grouped by offsets (per-group tensor
scales, padded column-wise layout), weights stacked [G, N, K].
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.gemm.dense_scaled import reference_operand
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_scaled import grouped_gemm_scaled, reference_grouped_gemm_scaled
from fuseops.kernels.gemm.grouped_scaled_wgrad import grouped_gemm_scaled_wgrad, reference_grouped_gemm_scaled_wgrad
from fuseops.kernels.quantization import quantize as kq
from fuseops.kernels.quantization.amax import reference_amax
from fuseops.kernels.quantization.formats import Element, Scaling, tensor_encode_scale
from fuseops.kernels.quantization.operand import Operand
from tests.helpers import REL_TOL, assert_close_rel, poison_, rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# scaling -> (x / w element, dy element, weight in 128x128 tiles)
CASES = {
    "tensor": (Scaling.TENSOR, Element.E4M3, Element.E5M2, False),
    "block": (Scaling.BLOCK, Element.E4M3, Element.E5M2, True),
    "mx": (Scaling.MX, Element.E4M3, Element.E5M2, False),
    "nvfp4": (Scaling.NVFP4, Element.E2M1, Element.E2M1, False),
}
SPLITS = {"mixed": [5, 0, 70, 1, 33, 0], "one_holds_all": [0, 130, 0]}
# (K, N): 16-byte-aligned rows (TMA) and odd ones (masked pointers).
SHAPES = {"aligned": (128, 64), "odd": (72, 40)}
LAYOUTS = [("mixed", "aligned"), ("mixed", "odd"), ("one_holds_all", "aligned")]


def factor(scaling: Scaling) -> float:
    """Tolerance factor: Hopper's FP8 tensor cores accumulate with ~14 significant bits, so
    float8 products agree with float64 to ~1e-4 on the GPU (exact in the interpreter)."""
    return 100.0 if DEVICE == "cuda" and scaling in (Scaling.TENSOR, Scaling.BLOCK) else 1.0


def quantized(x3: torch.Tensor, offsets, n: int, scaling, element, block_2d=False):
    enc = None
    if scaling in (Scaling.TENSOR, Scaling.NVFP4):
        enc = tensor_encode_scale(reference_amax(x3, offsets, n), scaling, element)
    bufs = kq.reference_quantize(x3, offsets, enc, scaling=scaling, element=element, block_2d=block_2d,
                                 rowwise=True, columnwise=offsets is not None)
    return bufs, None if enc is None else enc.reciprocal()


def make(case: str, split: str, shape: str):
    scaling, ex, eg, b2 = CASES[case]
    sizes = SPLITS[split]
    K, N = SHAPES[shape]
    G, M = len(sizes), sum(sizes)
    offsets = group_offsets(torch.tensor(sizes, device=DEVICE))
    x, x_outer = quantized(torch.randn(1, M, K, device=DEVICE), offsets, G, scaling, ex)
    dy, dy_outer = quantized(torch.randn(1, M, N, device=DEVICE), offsets, G, scaling, eg)
    w, w_outer = quantized(torch.randn(G, N, K, device=DEVICE), None, G, scaling, ex, b2)

    def sq(t):
        return None if t is None else t[0]

    ops = {
        "x": Operand(x.data[0], sq(x.scale), x_outer),
        "x_t": Operand(x.data_t[0], sq(x.scale_t), x_outer),
        "dy_t": Operand(dy.data_t[0], sq(dy.scale_t), dy_outer),
        "w": Operand(w.data, w.scale, w_outer, 128 if b2 else 1),
    }
    return scaling, offsets, ops


def oracle_forward(a: Operand, b: Operand, offsets, scaling) -> torch.Tensor:
    A = reference_operand(Operand(a.data, a.scale), scaling).double()
    B = reference_operand(b, scaling).double()
    bounds = offsets.tolist()
    y = torch.zeros(A.shape[0], B.shape[1], dtype=torch.float64, device=A.device)
    for g in range(B.shape[0]):
        r = slice(bounds[g], bounds[g + 1])
        y[r] = A[r] @ B[g].T * (a.outer[g].double() if a.outer is not None else 1.0)
    return y


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("split, shape", LAYOUTS)
def test_forward_matches_reference(case, split, shape):
    scaling, offsets, ops = make(case, split, shape)
    a, b = ops["x"], ops["w"]
    out = poison_(torch.empty(a.data.shape[0], b.data.shape[1], device=DEVICE))
    y = grouped_gemm_scaled(a, b, offsets, scaling=scaling, out_dtype=torch.float32, out=out)
    assert y is out
    expected = oracle_forward(a, b, offsets, scaling)
    assert_close_rel(y, expected, torch.float32, factor(scaling), what=f"{case} {split} {shape}")
    ref = reference_grouped_gemm_scaled(a, b, offsets, scaling=scaling, out_dtype=torch.float32)
    assert rel_err(ref, expected) < REL_TOL[torch.float32]


@pytest.mark.parametrize("case", CASES)
def test_dgrad_with_bias_in_bf16(case):
    """dgrad shape: the weight's column-wise copy [G, K, N] against dy; plus a bias."""
    scaling, ex, eg, b2 = CASES[case]
    sizes = SPLITS["mixed"]
    G, M, K, N = len(sizes), sum(sizes), 64, 96
    offsets = group_offsets(torch.tensor(sizes, device=DEVICE))
    dy, dy_outer = quantized(torch.randn(1, M, N, device=DEVICE), offsets, G, scaling, eg)
    w_bufs, w_outer = quantized(torch.randn(G, K, N, device=DEVICE), None, G, scaling, ex, b2)
    a = Operand(dy.data[0], None if dy.scale is None else dy.scale[0], dy_outer)
    b = Operand(w_bufs.data, w_bufs.scale, w_outer, 128 if b2 else 1)
    bias = torch.randn(G, K, device=DEVICE).to(torch.bfloat16)
    y = grouped_gemm_scaled(a, b, offsets, scaling=scaling, out_dtype=torch.bfloat16, bias=bias)
    expected = oracle_forward(a, b, offsets, scaling)
    bounds = offsets.tolist()
    for g in range(G):
        expected[bounds[g]:bounds[g + 1]] += bias[g].double()
    assert_close_rel(y, expected, torch.bfloat16, what=case)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_large(case):
    scaling, ex, eg, b2 = CASES[case]
    sizes = [900, 0, 2100, 64, 1033, 0, 3000, 1]
    G, M, K, N = len(sizes), sum(sizes), 1024, 768
    offsets = group_offsets(torch.tensor(sizes, device=DEVICE))
    x, x_outer = quantized(torch.randn(1, M, K, device=DEVICE), offsets, G, scaling, ex)
    dy, dy_outer = quantized(torch.randn(1, M, N, device=DEVICE), offsets, G, scaling, eg)
    w, w_outer = quantized(torch.randn(G, N, K, device=DEVICE), None, G, scaling, ex, b2)
    a = Operand(x.data[0], None if x.scale is None else x.scale[0], x_outer)
    b = Operand(w.data, w.scale, w_outer, 128 if b2 else 1)
    y = grouped_gemm_scaled(a, b, offsets, scaling=scaling, out_dtype=torch.bfloat16)
    ref = reference_grouped_gemm_scaled(a, b, offsets, scaling=scaling, out_dtype=torch.float32)
    assert rel_err(y, ref) < 1e-2
    a_t = Operand(dy.data_t[0], None if dy.scale_t is None else dy.scale_t[0], dy_outer)
    b_t = Operand(x.data_t[0], None if x.scale_t is None else x.scale_t[0], x_outer)
    dw = grouped_gemm_scaled_wgrad(a_t, b_t, offsets, scaling=scaling, out_dtype=torch.float32)
    ref = reference_grouped_gemm_scaled_wgrad(a_t, b_t, offsets, scaling=scaling, out_dtype=torch.float32)
    assert rel_err(dw, ref) < 1e-5 * factor(scaling)
