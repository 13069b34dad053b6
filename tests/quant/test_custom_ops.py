"""The quantized kernels' ``fuseops::`` custom ops (fuseops/kernels/quantized_ops/) pass
``torch.library.opcheck`` on CPU (schema, fake implementation against the real outputs' shapes,
dtypes and strides, traced dispatch), with zero rows and grouped offsets holding an empty
group; and each op returns what its launcher returns."""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.quantized_ops import gemm, grouped_mlp, producers, quantize
from fuseops.kernels.quantized_ops._args import operand_args
from fuseops.quant.recipes import TensorRole
from tests.helpers import assert_bitwise

RECIPES = [fuseops.recipes.FP8CurrentScaling(), fuseops.recipes.FP8Blockwise(), fuseops.recipes.MXFP8(),
           fuseops.recipes.NVFP4()]
IDS = [type(r).__name__ for r in RECIPES]
# Group sizes: an empty group in the middle; and no rows at all.
SPLITS = {"groups": [3, 0, 5], "no-rows": [0, 0, 0]}


def offsets_of(splits: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(splits).cumsum(0).tolist()])


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def check(op, args):
    """``opcheck``; where an input is float8 its test_schema part (which compares the inputs
    before and after the call with ``allclose``, not implemented for float8 on CPU) is done
    here by bytes: no input changed, no output shares an input's memory."""
    float8 = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point() and a.element_size() == 1]
    if not float8:
        torch.library.opcheck(op, args)
        return
    torch.library.opcheck(op, args, test_utils=("test_autograd_registration", "test_faketensor",
                                                "test_aot_dispatch_dynamic"))
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    before = [_bytes(a).clone() for a in inputs]
    outputs = op(*args)
    for a, b in zip(inputs, before, strict=True):
        assert torch.equal(_bytes(a), b), "an input was mutated"
    storages = {a.untyped_storage().data_ptr() for a in inputs if a.numel()}
    for o in (outputs if isinstance(outputs, tuple) else (outputs,)):
        assert not o.numel() or o.untyped_storage().data_ptr() not in storages, "an output aliases an input"


def fmt(recipe, role=TensorRole.INPUT):
    f = recipe.format(role)
    return f.scaling, f.element


@pytest.mark.parametrize("rows", ["groups", "no-rows"])
def test_amax_and_tensor_scales_ops(rows):
    offsets = offsets_of(SPLITS[rows])
    x = torch.randn(1, int(offsets[-1]), 40, dtype=torch.bfloat16)
    check(quantize._amax_op, (x, offsets, 3, None))
    check(quantize._amax_op, (torch.randn(2, 5, 40), None, 2, None))
    amax = quantize._amax_op(x, offsets, 3, None)
    assert torch.equal(amax, launcher(Kernel.AMAX, x)(x, offsets, 3))
    # Picked rows (MoE's permuted tokens): the amaxes of x[:, picked].
    picked = torch.randint(0, max(1, x.shape[1]), (x.shape[1],))
    check(quantize._amax_op, (x, offsets, 3, picked))
    assert torch.equal(quantize.amax(x, offsets, 3, rows=picked), launcher(Kernel.AMAX, x)(x[:, picked], offsets, 3))
    check(quantize._tensor_scales_op, (torch.tensor([0.0, 3.0, 448.0]), 448.0))
    check(quantize._row_amax_op, (x[0],))
    assert torch.equal(quantize.row_amax(x[0]), launcher(Kernel.ROW_AMAX, x)(x[0]))


@pytest.mark.parametrize("rows", ["groups", "no-rows"])
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_quantize_op(recipe, rows):
    offsets = offsets_of(SPLITS[rows])
    x = torch.randn(1, int(offsets[-1]), 64, dtype=torch.bfloat16)
    scaling, element = fmt(recipe)
    encode = torch.tensor([2.0, 1.0, 0.5]) if recipe.format(TensorRole.INPUT).scaling.name in ("TENSOR", "NVFP4") \
        else None
    for rowwise, columnwise in ((True, True), (False, True), (True, False)):
        args = (x, offsets, encode, int(scaling), int(element), False, rowwise, columnwise, None)
        check(quantize._quantize_op, args)
        # Picked rows: x's rows in another order and count, grouped by the same offsets.
        tokens = x[:, : max(1, x.shape[1] // 2)]
        picked = torch.randint(0, max(1, tokens.shape[1]), (x.shape[1],))
        check(quantize._quantize_op, (tokens, *args[1:-1], picked))
        got = quantize.quantize(tokens, offsets, encode, scaling=scaling, element=element, rowwise=rowwise,
                                columnwise=columnwise, rows=picked)
        want = launcher(Kernel.QUANTIZE, x)(tokens[:, picked], offsets, encode, scaling=scaling, element=element,
                                            rowwise=rowwise, columnwise=columnwise)
        for name, g, w in zip(want._fields, got, want, strict=True):
            assert_bitwise(g, w, name)
        got = quantize.quantize(x, offsets, encode, scaling=scaling, element=element, rowwise=rowwise,
                                columnwise=columnwise)
        want = launcher(Kernel.QUANTIZE, x)(x, offsets, encode, scaling=scaling, element=element,
                                            rowwise=rowwise, columnwise=columnwise)
        for name, g, w in zip(want._fields, got, want, strict=True):
            assert_bitwise(g, w, name)


def test_quantize_op_with_128x128_tiles():
    w = torch.randn(2, 130, 64)
    scaling, element = fmt(fuseops.recipes.FP8Blockwise(), TensorRole.WEIGHT)
    check(quantize._quantize_op, (w, None, None, int(scaling), int(element), True, True, True, None))


def _grouped(recipe, rows, columnwise=False, role=TensorRole.INPUT, width=128):
    offsets = offsets_of(SPLITS[rows])
    x = torch.randn(int(offsets[-1]), width, dtype=torch.bfloat16)
    return fuseops.quantize(x, recipe, role=role, rowwise=True, columnwise=columnwise, offsets=offsets), offsets


def _weight(recipe, shape, columnwise=False):
    return fuseops.quantize(torch.randn(*shape, dtype=torch.bfloat16), recipe, role=TensorRole.WEIGHT,
                            rowwise=True, columnwise=columnwise)


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_gemm_scaled_op(recipe):
    scaling = int(recipe.format(TensorRole.INPUT).scaling)
    qx = fuseops.quantize(torch.randn(6, 128, dtype=torch.bfloat16), recipe, rowwise=True, columnwise=True)
    qw = _weight(recipe, (32, 128))
    a, b = operand_args(qx.rowwise_operand()), operand_args(qw.rowwise_operand())
    check(gemm._gemm_scaled_op, (*a, *b, scaling, torch.bfloat16, torch.randn(32), None))
    # wgrad into main_grad: the op returns main_grad + dw, main_grad untouched.
    qdy = fuseops.quantize(torch.randn(6, 32, dtype=torch.bfloat16), recipe, role=TensorRole.GRAD,
                           rowwise=False, columnwise=True)
    dy_t, x_t = operand_args(qdy.columnwise_operand()), operand_args(qx.columnwise_operand())
    main_grad = torch.randn(32, 128)
    before = main_grad.clone()
    check(gemm._gemm_scaled_op, (*dy_t, *x_t, scaling, torch.float32, None, main_grad))
    got = gemm.gemm_scaled(qdy.columnwise_operand(), qx.columnwise_operand(), scaling=qdy.format.scaling,
                           out_dtype=torch.float32, main_grad=main_grad)
    assert got is main_grad
    want = launcher(Kernel.GEMM_SCALED, qx.data)(qdy.columnwise_operand(), qx.columnwise_operand(),
                                                 scaling=qdy.format.scaling, out_dtype=torch.float32,
                                                 main_grad=before.clone())
    assert_bitwise(got, want, "main_grad")


@pytest.mark.parametrize("rows", ["groups", "no-rows"])
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_grouped_gemm_scaled_ops(recipe, rows):
    scaling = int(recipe.format(TensorRole.INPUT).scaling)
    qx, offsets = _grouped(recipe, rows, columnwise=True)
    qw = _weight(recipe, (3, 32, 128))
    a, b = operand_args(qx.rowwise_operand()), operand_args(qw.rowwise_operand())
    check(gemm._grouped_gemm_scaled_op, (*a, *b, offsets, scaling, torch.bfloat16, torch.randn(3, 32)))
    qdy, _ = _grouped(recipe, rows, columnwise=True, role=TensorRole.GRAD, width=32)
    dy_t, x_t = operand_args(qdy.columnwise_operand()), operand_args(qx.columnwise_operand())
    check(gemm._wgrad_op, (*dy_t, *x_t, offsets, scaling, torch.bfloat16, None))
    check(gemm._wgrad_op, (*dy_t, *x_t, offsets, scaling, torch.float32, torch.randn(3, 32, 128)))


@pytest.mark.parametrize("rows", ["groups", "no-rows"])
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_grouped_mlp_ops(recipe, rows):
    scaling, element = fmt(recipe)
    qx, offsets = _grouped(recipe, rows)
    M = qx.shape[0]
    qw1 = _weight(recipe, (3, 64, 128))
    a, b = operand_args(qx.rowwise_operand()), operand_args(qw1.rowwise_operand())
    gate = (int(Activation.SILU), False, False, 7.0, 1.0)
    for gated, probs in ((True, torch.rand(M, dtype=torch.bfloat16)), (False, None)):
        for store_y in (True, False):
            check(grouped_mlp._act_op, (*a, *b, offsets, *gate, probs, gated, torch.randn(3, 64), True,
                                        int(scaling), int(element), store_y, torch.bfloat16))
    grad_scaling, grad_element = fmt(recipe, TensorRole.GRAD)
    qdy, _ = _grouped(recipe, rows, role=TensorRole.GRAD)
    qw2 = _weight(recipe, (3, 128, 32), columnwise=True)
    z = torch.randn(M, 64, dtype=torch.bfloat16)
    a2, b2 = operand_args(qdy.rowwise_operand()), operand_args(qw2.columnwise_operand())
    # Interleaved gate and up columns: F = 32 need not hold whole gradient blocks.
    interleaved = (int(Activation.SILU), True, False, 7.0, 1.0)
    check(grouped_mlp._dgrad_gated_op, (*a2, *b2, offsets, z, int(grad_scaling), *interleaved, torch.rand(M),
                                        int(grad_scaling), int(grad_element), True, torch.bfloat16))


@pytest.mark.parametrize("rows", [5, 0])
@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_producer_ops(recipe, rows):
    scaling, element = fmt(recipe)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    w, bias = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    form = (int(scaling), int(element))
    for store_y in (True, False):
        check(producers._activation_op, (x, int(Activation.GELU), 1.0, *form, store_y))
        check(producers._gated_op, (x, int(Activation.SILU), True, True, 7.0, 1.702, torch.rand(rows), *form,
                                    store_y))
        check(producers._layernorm_op, (x, w, bias, 1e-5, False, *form, store_y))
        check(producers._rmsnorm_op, (x, w, 1e-5, True, *form, store_y))
    got, rstd = producers.rmsnorm_quantize_fwd(x, w, 1e-5, scaling=scaling, element=element, store_y=False)
    want, want_rstd = launcher(Kernel.RMSNORM_QUANTIZE_FWD, x)(x, w, 1e-5, scaling=scaling, element=element,
                                                               store_y=False)
    assert_bitwise(rstd, want_rstd, "rstd")
    for name, g, v in zip(want._fields, got, want, strict=True):
        assert_bitwise(g, v, name)


def test_an_identity_activation_returns_no_alias_of_its_input():
    # The float32 reference of the identity hands back x itself; the op copies it.
    x = torch.randn(4, 64)
    scaling, element = fmt(fuseops.recipes.FP8CurrentScaling())
    y = producers._activation_op(x, int(Activation.IDENTITY), 1.0, int(scaling), int(element), True)[0]
    assert torch.equal(y, x) and y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    check(producers._activation_op, (x, int(Activation.IDENTITY), 1.0, int(scaling), int(element), True))
