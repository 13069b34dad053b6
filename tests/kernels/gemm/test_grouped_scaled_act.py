"""grouped_gemm_scaled_act (FC1 under a recipe, activation and FC2's input quantization in the
epilogue) against float64 and its reference, through the interpreter.

``z`` against the float64 product of the dequantized operands; ``h`` against the activation
of the kernel's own ``z`` (the activation op reads ``z`` rounded); what the epilogue writes
from ``h`` against ``quant_epilogue.reference_emit(h)`` bit for bit, with and without ``h``
stored. Operands come from ``fuseops.quantize`` under each recipe (x grouped by offsets, the
weight stacked [G, N, K]); split sizes with empty groups, all rows in one group, no rows.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.elementwise.activation import reference_activation_fwd
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.elementwise.gated_activation import reference_gated_fwd
from fuseops.kernels.gemm.dense_scaled import reference_operand
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_scaled_act import grouped_gemm_scaled_act, reference_grouped_gemm_scaled_act
from fuseops.kernels.quantization import epilogue as qe
from fuseops.kernels.quantization.formats import Scaling
from fuseops.kernels.quantization.operand import Operand
from fuseops.quant import quantize, recipes
from fuseops.quant.recipes import TensorRole
from tests.helpers import assert_bitwise, assert_close_rel, cuda_or_skip
from tests.kernels.quantization.test_epilogue import poisoned_outputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

RECIPES = {
    "tensor": recipes.FP8CurrentScaling(),
    "block": recipes.FP8Blockwise(),
    "mx": recipes.MXFP8(),
    "nvfp4": recipes.NVFP4(),
}
# The launcher's activation arguments; ``probs`` asks for router probabilities. The clamp
# limit lies inside the values' range.
GATES = {
    "gelu": dict(act=Activation.GELU_TANH),
    "swiglu-probs": dict(act=Activation.SILU, gated=True, probs=True),
    "geglu-interleaved": dict(act=Activation.GELU, gated=True, interleaved=True),
    "clamped-swiglu-interleaved-probs": dict(act=Activation.SILU, gated=True, interleaved=True, clamped=True,
                                             limit=1.5, alpha=1.702, probs=True),
}
SPLITS = {"mixed": [5, 0, 40, 1, 33, 0], "one_holds_all": [0, 71, 0], "all_empty": [0, 0]}
# (K, F): 16-byte-aligned rows (TMA) and odd ones (masked pointers) with F over several
# column tiles of every format (FP8 blockwise's are 128 wide).
SHAPES = {"aligned": (64, 48), "odd": (40, 136)}


def factor(scaling: Scaling) -> float:
    """Hopper's FP8 tensor cores accumulate with ~14 significant bits (gemm/test_grouped_scaled.py)."""
    return 100.0 if DEVICE == "cuda" and scaling in (Scaling.TENSOR, Scaling.BLOCK) else 1.0


def make(recipe_name, gate, sizes, K, F, dtype, *, bias=True, device=DEVICE):
    """Quantized operands, offsets and the launcher's keyword arguments."""
    recipe = RECIPES[recipe_name]
    kw = dict(GATES[gate])
    G, M = len(sizes), sum(sizes)
    N = 2 * F if kw.get("gated") else F
    offsets = group_offsets(torch.tensor(sizes, device=device))
    x = torch.randn(M, K, device=device).to(dtype)
    w = (torch.randn(G, N, K, device=device) * 2 * K**-0.5).to(dtype)
    a = quantize(x, recipe, role=TensorRole.INPUT, offsets=offsets).rowwise_operand()
    b = quantize(w, recipe, role=TensorRole.WEIGHT).rowwise_operand()
    kw["probs"] = torch.rand(M, device=device) if kw.pop("probs", False) else None
    kw["bias"] = torch.randn(G, N, device=device).to(dtype) if bias else None
    fmt = recipe.format(TensorRole.INPUT)
    kw.update(scaling=fmt.scaling, element=fmt.element, out_dtype=dtype)
    return a, b, offsets, kw


def activate(z, kw):
    """The activation op's forward on ``z``, in float64."""
    if kw.get("gated"):
        gate = {k: kw[k] for k in ("interleaved", "clamped", "limit", "alpha") if k in kw}
        return reference_gated_fwd(z.double(), kw["act"], probs=kw["probs"], **gate)
    return reference_activation_fwd(z.double(), kw["act"], kw.get("alpha", 1.0))


def oracle_z(a: Operand, b: Operand, offsets, scaling, bias):
    """float64 ``z``: the dequantized operands' product per group, plus bias."""
    A = reference_operand(Operand(a.data, a.scale), scaling).double()
    B = reference_operand(b, scaling).double()
    z = torch.zeros(A.shape[0], B.shape[1], dtype=torch.float64, device=A.device)
    bounds = offsets.tolist()
    for g in range(B.shape[0]):
        r = slice(bounds[g], bounds[g + 1])
        z[r] = A[r] @ B[g].T * (a.outer[g].double() if a.outer is not None else 1.0)
        if bias is not None:
            z[r] += bias[g].double()
    return z


def run(launch, a, b, offsets, kw, *, store_y=True, save_preact=True):
    """The launcher into poisoned buffers (``row_amax`` zeroed)."""
    M, F = a.data.shape[0], b.data.shape[1] // (2 if kw.get("gated") else 1)
    out = poisoned_outputs(M, F, kw["out_dtype"], a.data.device, kw["scaling"], kw["element"], store_y)
    emitted, z = launch(a, b, offsets, store_y=store_y, save_preact=save_preact, out=out, **kw)
    assert emitted is out
    return emitted, z


def check(a, b, offsets, kw, what, tol_factor=1.0):
    """Kernel and reference: z against float64, h against the activation of their own z, the
    quantized copy against ``reference_emit(h)``; the kernel without h or z stored."""
    dtype, scaling, element = kw["out_dtype"], kw["scaling"], kw["element"]
    z64 = oracle_z(a, b, offsets, scaling, kw["bias"])
    results = {}
    for name, launch in (("kernel", grouped_gemm_scaled_act), ("reference", reference_grouped_gemm_scaled_act)):
        emitted, z = results[name] = run(launch, a, b, offsets, kw)
        assert z.dtype == dtype and emitted.y.dtype == dtype
        assert_close_rel(z, z64, dtype, tol_factor * factor(scaling), what=f"{what} {name} z")
        assert_close_rel(emitted.y, activate(z, kw), dtype, what=f"{what} {name} h")
        expected = qe.reference_emit(emitted.y, scaling=scaling, element=element, store_y=True)
        for field, got, want in zip(qe.Emitted._fields, emitted, expected):
            assert_bitwise(got, want, f"{what} {name} {field}")
    bare, no_z = run(grouped_gemm_scaled_act, a, b, offsets, kw, store_y=False, save_preact=False)
    assert bare.y is None and no_z is None
    for field, got, want in zip(qe.Emitted._fields[1:], bare[1:], results["kernel"][0][1:]):
        assert_bitwise(got, want, f"{what} {field} (h and z not stored)")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("recipe", RECIPES)
def test_matches_float64_and_reference_bf16(recipe, gate, shape):
    K, F = SHAPES[shape]
    a, b, offsets, kw = make(recipe, gate, SPLITS["mixed"], K, F, torch.bfloat16)
    check(a, b, offsets, kw, f"{recipe} {gate} {shape}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("gate", ["gelu", "swiglu-probs"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_float32_and_float16_without_bias(recipe, gate, dtype):
    K, F = SHAPES["aligned"]
    a, b, offsets, kw = make(recipe, gate, SPLITS["mixed"], K, F, dtype, bias=False)
    check(a, b, offsets, kw, f"{recipe} {gate} {dtype}")


@pytest.mark.parametrize("split", ["one_holds_all", "all_empty"])
@pytest.mark.parametrize("gate", ["gelu", "clamped-swiglu-interleaved-probs"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_all_rows_in_one_group_or_none(recipe, gate, split):
    K, F = SHAPES["aligned"]
    a, b, offsets, kw = make(recipe, gate, SPLITS[split], K, F, torch.bfloat16)
    if split == "all_empty":
        emitted, z = run(grouped_gemm_scaled_act, a, b, offsets, kw)
        assert emitted.y.shape == (0, F) and z.shape == (0, b.data.shape[1])
        return
    check(a, b, offsets, kw, f"{recipe} {gate} {split}")


@pytest.mark.gpu
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("recipe", RECIPES)
def test_gpu_large_bf16(recipe, gate):
    device = cuda_or_skip()
    sizes = [900, 0, 2100, 64, 1033, 0, 3000, 1]
    a, b, offsets, kw = make(recipe, gate, sizes, 1024, 768, torch.bfloat16, device=device)
    check(a, b, offsets, kw, f"{recipe} {gate}")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mx", "nvfp4"])
def test_gpu_one_column_float32(recipe):
    """The sm_90 build on the masked-pointer path, K under one block, one column of h:
    with F specialised to 1 it once stored MXFP8 scales 2**8 off (the formats the fusion
    applies under; each case compiles four variants, so two cases)."""
    device = cuda_or_skip()
    a, b, offsets, kw = make(recipe, "clamped-swiglu-interleaved-probs", [1, 0, 2], 2, 1, torch.float32,
                             device=device)
    check(a, b, offsets, kw, recipe)
