"""grouped_gemm_scaled_dgrad_gated (FC2's quantized dgrad, the gate's derivative and dz's
quantization in the epilogue) against its reference and float64, through the interpreter.

``dz`` (stored) against the reference (the unfused ops' maths) and against float64 of the
dequantized operands; what the epilogue writes from ``dz`` against
``quant_epilogue.reference_emit`` of the kernel's own ``dz`` bit for bit; the single-pass
block formats' row-wise copy (``dz`` not stored) equal to the stored run's; ``dprobs`` against
the reference. Operands from ``fuseops.quantize`` under each recipe (dy grouped by offsets
in the gradient format, the weight's column-wise copy); empty groups, no rows.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.elementwise.gated_activation import reference_gated_bwd
from fuseops.kernels.gemm.dense_scaled import reference_operand
from fuseops.kernels.gemm.group_offsets import group_offsets
from fuseops.kernels.gemm.grouped_scaled_dgrad_gated import (
    grouped_gemm_scaled_dgrad_gated,
    reference_grouped_gemm_scaled_dgrad_gated,
)
from fuseops.kernels.quantization import epilogue as qe
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand
from fuseops.quant import quantize, recipes
from fuseops.quant.recipes import TensorRole
from tests.helpers import assert_bitwise, assert_close_rel, cuda_or_skip

RECIPES = {
    "tensor": recipes.FP8CurrentScaling(),
    "block": recipes.FP8Blockwise(),
    "mx": recipes.MXFP8(),
    "nvfp4": recipes.NVFP4(),
}
GATES = {
    "swiglu-probs": dict(act=Activation.SILU, probs=True),
    "clamped-swiglu-interleaved-probs": dict(act=Activation.SILU, interleaved=True, clamped=True, limit=1.5,
                                             alpha=1.702, probs=True),
    "geglu": dict(act=Activation.GELU),
}
SPLITS = {"mixed": [5, 0, 40, 19], "all_empty": [0, 0]}
H = 64  # FC2's output features: the reduction dim of its dgrad


def make(recipe_name, gate, sizes, F, dtype=torch.float32, device="cpu", h=H):
    recipe = RECIPES[recipe_name]
    kw = dict(GATES[gate])
    G, M = len(sizes), sum(sizes)
    offsets = group_offsets(torch.tensor(sizes, device=device))
    dy = torch.randn(M, h, device=device).to(dtype)
    w2 = (torch.randn(G, h, F, device=device) * h**-0.5).to(dtype)
    a = quantize(dy, recipe, role=TensorRole.GRAD, offsets=offsets).rowwise_operand()
    b = quantize(w2, recipe, role=TensorRole.WEIGHT, rowwise=False, columnwise=True).columnwise_operand()
    z = (torch.randn(M, 2 * F, device=device) * 2).to(dtype)
    kw["probs"] = torch.rand(M, device=device) if kw.pop("probs", False) else None
    grad = recipe.format(TensorRole.GRAD)
    kw.update(scaling=recipe.format(TensorRole.INPUT).scaling, grad_scaling=grad.scaling, element=grad.element,
              out_dtype=dtype)
    return a, b, offsets, z, kw


def factor(scaling: Scaling, device) -> float:
    """Hopper's FP8 tensor cores accumulate with ~14 significant bits (gemm/test_grouped_scaled.py)."""
    return 100.0 if torch.device(device).type == "cuda" and scaling in (Scaling.TENSOR, Scaling.BLOCK) else 1.0


def check(a, b, offsets, z, kw, what):
    dtype, F = z.dtype, b.data.shape[1]
    tol = factor(kw["scaling"], z.device)
    out, dprobs = grouped_gemm_scaled_dgrad_gated(a, b, offsets, z, store_y=True, **kw)
    ref, ref_dprobs = reference_grouped_gemm_scaled_dgrad_gated(a, b, offsets, z, store_y=True, **kw)
    assert_close_rel(out.y, ref.y, dtype, tol, what=f"{what} dz")
    if kw["probs"] is not None:
        assert_close_rel(dprobs, ref_dprobs, dtype, tol, what=f"{what} dprobs")
    # float64 of the dequantized operands (dh unrounded: the dtype's tolerance covers it).
    A = reference_operand(Operand(a.data, a.scale, None, a.rows_per_scale), kw["scaling"]).double()
    B = reference_operand(b, kw["scaling"]).double()
    dh = torch.zeros(A.shape[0], F, dtype=torch.float64, device=z.device)
    for g, (s, e) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
        outer = 1.0 if a.outer is None else (a.outer[s:e, None] if a.outer_per_row else a.outer[g]).double()
        dh[s:e] = A[s:e] @ B[g].T * outer
    probs64 = None if kw["probs"] is None else kw["probs"].double()
    dz64, _ = reference_gated_bwd(z.double(), dh, kw["act"], interleaved=kw.get("interleaved", False),
                                  clamped=kw.get("clamped", False), limit=kw.get("limit", 7.0),
                                  alpha=kw.get("alpha", 1.0), probs=probs64)
    assert_close_rel(out.y, dz64, dtype, tol, what=f"{what} dz against float64")
    emitted = qe.reference_emit(out.y, scaling=kw["grad_scaling"], element=kw["element"], store_y=True)
    for name, got, want in zip(qe.Emitted._fields, out, emitted):
        assert_bitwise(got, want, f"{what} {name}")
    if qe.blocks_in_epilogue(kw["grad_scaling"]):
        single, _ = grouped_gemm_scaled_dgrad_gated(a, b, offsets, z, store_y=False, **kw)
        assert single.y is None
        assert_bitwise(single.data, out.data, f"{what} data")
        assert_bitwise(single.scale, out.scale, f"{what} scale")


@pytest.mark.skipif(not INTERPRET, reason="interpreter only on CPU machines")
@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_matches_reference_and_emits_its_own_dz(recipe_name, gate, split):
    F = 128 if recipe_name == "block" else 96
    a, b, offsets, z, kw = make(recipe_name, gate, SPLITS[split], F)
    with interpreted_kernels():
        check(a, b, offsets, z, kw, f"{recipe_name} {gate} {split}")


@pytest.mark.gpu
@pytest.mark.parametrize("gate", list(GATES))
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_gpu_large_bf16(recipe_name, gate):
    """TMA-aligned operands (H = 64 bytes a row and more), several column tiles, empty groups."""
    device = cuda_or_skip()
    sizes = [900, 0, 2100, 64, 1033, 0, 1]
    F = 768 if recipe_name == "block" else 640
    a, b, offsets, z, kw = make(recipe_name, gate, sizes, F, torch.bfloat16, device)
    check(a, b, offsets, z, kw, f"{recipe_name} {gate}")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe_name", list(RECIPES))
def test_gpu_odd_rows_float32(recipe_name):
    """The masked-pointer path: H = 40 (quantized rows of 40 or 20 bytes, no TMA), float32."""
    device = cuda_or_skip()
    F = 128 if recipe_name == "block" else 32
    a, b, offsets, z, kw = make(recipe_name, "clamped-swiglu-interleaved-probs", [3, 0, 17], F, torch.float32, device,
                                h=40)
    check(a, b, offsets, z, kw, recipe_name)


def test_rejects_a_block_straddling_the_halves():
    a, b, offsets, z, kw = make("block", "swiglu-probs", [4, 4], 48)
    with pytest.raises(ValueError, match="F: expected a multiple of the gradient format's block 128"):
        reference_grouped_gemm_scaled_dgrad_gated(a, b, offsets, z, store_y=True, **kw)
