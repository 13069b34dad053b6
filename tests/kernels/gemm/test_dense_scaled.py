"""gemm_scaled (dense GEMM on quantized operands) against its reference in float64.

Operands are quantized with the torch reference (bit-identical to the kernels, see
quantization/test_quantize.py); the product of their dequantized values in float64 is the oracle.
K = 256 rows are 16-byte aligned (TMA descriptors, also through the interpreter); K = 200
takes the masked-pointer path.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.gemm.dense_scaled import gemm_scaled, reference_gemm_scaled, reference_operand
from fuseops.kernels.quantization import quantize as kq
from fuseops.kernels.quantization.amax import reference_amax
from fuseops.kernels.quantization.formats import Element, Scaling, tensor_encode_scale
from fuseops.kernels.quantization.operand import Operand
from tests.helpers import REL_TOL, assert_close_rel, poison_, rel_err, sqnr_db

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# scaling -> (a element, b element, b in 128x128 tiles): the dgrad pairing (E5M2 gradients
# against E4M3 weights) where the format has both.
CASES = {
    "tensor": (Scaling.TENSOR, Element.E5M2, Element.E4M3, False),
    "block_1d_2d": (Scaling.BLOCK, Element.E5M2, Element.E4M3, True),
    "block_1d_1d": (Scaling.BLOCK, Element.E4M3, Element.E4M3, False),
    "mx": (Scaling.MX, Element.E5M2, Element.E4M3, False),
    "nvfp4": (Scaling.NVFP4, Element.E2M1, Element.E2M1, False),
}
SHAPES = {"tma": (64, 96, 256), "pointer": (70, 50, 200), "one": (1, 1, 40)}


def factor(scaling: Scaling) -> float:
    """Tolerance factor: Hopper's FP8 tensor cores accumulate with ~14 significant bits
    (DeepSeek-V3 report), so on the GPU float8 products agree with float64 to ~1e-4; the
    interpreter's, and the bf16 products of MX / NVFP4, are exact."""
    return 100.0 if DEVICE == "cuda" and scaling in (Scaling.TENSOR, Scaling.BLOCK) else 1.0


def operand(x: torch.Tensor, scaling: Scaling, element: Element, block_2d: bool = False) -> Operand:
    """``x`` [R, K] quantized along K (reference quantizer), as a GEMM operand."""
    x3 = x[None]
    enc = None
    if scaling in (Scaling.TENSOR, Scaling.NVFP4):
        enc = tensor_encode_scale(reference_amax(x3, None, 1), scaling, element)
    bufs = kq.reference_quantize(x3, None, enc, scaling=scaling, element=element, block_2d=block_2d)
    scale = None if bufs.scale is None else bufs.scale[0]
    return Operand(bufs.data[0], scale, None if enc is None else enc.reciprocal(), 128 if block_2d else 1)


def oracle(a: Operand, b: Operand, scaling: Scaling, bias=None) -> torch.Tensor:
    y = reference_operand(a, scaling).double() @ reference_operand(b, scaling).double().T
    return y + bias.double() if bias is not None else y


def make(case: str, shape: str):
    scaling, ea, eb, b2 = CASES[case]
    M, N, K = SHAPES[shape]
    a = operand(torch.randn(M, K, device=DEVICE), scaling, ea)
    b = operand(torch.randn(N, K, device=DEVICE), scaling, eb, b2)
    return scaling, a, b


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_gemm_scaled_matches_reference(case, shape):
    scaling, a, b = make(case, shape)
    out = poison_(torch.empty(a.data.shape[0], b.data.shape[0], device=DEVICE))
    y = gemm_scaled(a, b, scaling=scaling, out_dtype=torch.float32, out=out)
    assert y is out
    assert_close_rel(y, oracle(a, b, scaling), torch.float32, factor(scaling), what=f"{case} {shape}")
    ref = reference_gemm_scaled(a, b, scaling=scaling, out_dtype=torch.float32)
    assert rel_err(ref, oracle(a, b, scaling)) < REL_TOL[torch.float32]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_bias_and_low_precision_output(case, out_dtype):
    scaling, a, b = make(case, "tma")
    bias = torch.randn(b.data.shape[0], device=DEVICE).to(out_dtype)
    y = gemm_scaled(a, b, scaling=scaling, out_dtype=out_dtype, bias=bias)
    assert y.dtype == out_dtype
    assert_close_rel(y, oracle(a, b, scaling, bias), out_dtype, what=case)


@pytest.mark.parametrize("case", ["tensor", "block_1d_1d", "nvfp4"])
def test_main_grad_accumulates(case):
    scaling, a, b = make(case, "pointer")
    main_grad = torch.randn(a.data.shape[0], b.data.shape[0], device=DEVICE)
    expected = main_grad.double() + oracle(a, b, scaling)
    got = gemm_scaled(a, b, scaling=scaling, out_dtype=torch.bfloat16, main_grad=main_grad)
    assert got is main_grad and got.dtype == torch.float32
    assert_close_rel(got, expected, torch.float32, factor(scaling), what=case)


def test_per_row_scales():
    """Row-wise scaling (one float32 scale per row of each operand) in the epilogue."""
    a_hp, b_hp = torch.randn(70, 128, device=DEVICE), torch.randn(40, 128, device=DEVICE)

    def rowwise(x):
        scale = x.abs().amax(1).clamp(min=1e-12) / 448.0
        return Operand((x / scale[:, None]).to(torch.float8_e4m3fn), outer=scale, outer_per_row=True)

    a, b = rowwise(a_hp), rowwise(b_hp)
    y = gemm_scaled(a, b, scaling=Scaling.TENSOR, out_dtype=torch.float32)
    assert_close_rel(y, oracle(a, b, Scaling.TENSOR), torch.float32, factor(Scaling.TENSOR))
    assert sqnr_db(y, a_hp.double() @ b_hp.double().T) > 25


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_large(case):
    scaling, ea, eb, b2 = CASES[case]
    M, N, K = 1000, 1536, 2048
    x, w = torch.randn(M, K, device=DEVICE), torch.randn(N, K, device=DEVICE)
    a, b = operand(x, scaling, ea), operand(w, scaling, eb, b2)
    y = gemm_scaled(a, b, scaling=scaling, out_dtype=torch.bfloat16)
    assert_close_rel(y, oracle(a, b, scaling), torch.bfloat16, what=case)
