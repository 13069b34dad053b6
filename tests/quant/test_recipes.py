"""Recipes (formats per role, validation, hashing) and the autocast context."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.quant import autocast, current_recipe, recipes
from fuseops.quant.recipes import QuantFormat, Recipe, RecipeKind, TensorRole, as_role

INPUT, WEIGHT, GRAD = TensorRole.INPUT, TensorRole.WEIGHT, TensorRole.GRAD


@pytest.mark.parametrize(
    "recipe, role, expected",
    [
        (recipes.FP8CurrentScaling(), INPUT, QuantFormat(Scaling.TENSOR, Element.E4M3)),
        (recipes.FP8CurrentScaling(), WEIGHT, QuantFormat(Scaling.TENSOR, Element.E4M3)),
        (recipes.FP8CurrentScaling(), GRAD, QuantFormat(Scaling.TENSOR, Element.E5M2)),
        (recipes.FP8Blockwise(), INPUT, QuantFormat(Scaling.BLOCK, Element.E4M3)),
        (recipes.FP8Blockwise(), WEIGHT, QuantFormat(Scaling.BLOCK, Element.E4M3, block_2d=True)),
        (recipes.FP8Blockwise(), GRAD, QuantFormat(Scaling.BLOCK, Element.E5M2)),
        (recipes.MXFP8(), WEIGHT, QuantFormat(Scaling.MX, Element.E4M3)),
        (recipes.MXFP8(), GRAD, QuantFormat(Scaling.MX, Element.E5M2)),
        (recipes.MXFP8(grad_dtype=torch.float8_e4m3fn), GRAD, QuantFormat(Scaling.MX, Element.E4M3)),
        (recipes.NVFP4(), GRAD, QuantFormat(Scaling.NVFP4, Element.E2M1)),
    ],
)
def test_formats(recipe, role, expected):
    assert recipe.format(role) == expected


def test_block_sizes_and_kinds():
    assert [QuantFormat(s, Element.E4M3).block for s in Scaling] == [0, 128, 32, 16]
    kinds = [r().kind for r in (recipes.FP8CurrentScaling, recipes.FP8Blockwise, recipes.MXFP8, recipes.NVFP4)]
    assert kinds == list(RecipeKind)


def test_recipes_are_frozen_and_hashable():
    a, b = recipes.MXFP8(), recipes.MXFP8()
    assert a == b and hash(a) == hash(b)
    assert recipes.MXFP8() != recipes.FP8Blockwise()
    assert len({a, b, recipes.NVFP4(), recipes.MXFP8(grad_dtype=torch.float8_e4m3fn)}) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.grad_dtype = torch.float8_e4m3fn
    with pytest.raises(TypeError):
        Recipe()


def test_bad_grad_dtype():
    with pytest.raises(ValueError, match="grad_dtype: expected torch.float8_e5m2 or torch.float8_e4m3fn, got torch.bfloat16"):
        recipes.FP8CurrentScaling(grad_dtype=torch.bfloat16)


def test_roles_from_strings():
    assert as_role("grad") is GRAD and as_role(WEIGHT) is WEIGHT
    with pytest.raises(ValueError, match="'input', 'weight', 'grad'"):
        as_role("activation")


def test_autocast_nests_and_restores():
    assert current_recipe() is None
    outer, inner = recipes.FP8CurrentScaling(), recipes.NVFP4()
    with autocast(recipe=outer):
        assert current_recipe() is outer
        with autocast(recipe=inner):
            assert current_recipe() is inner
            with autocast(None):
                assert current_recipe() is None
            assert current_recipe() is inner
        with pytest.raises(RuntimeError), autocast(recipe=inner):
            raise RuntimeError("inside")
        assert current_recipe() is outer
    assert current_recipe() is None


def test_autocast_rejects_non_recipes():
    with pytest.raises(TypeError, match="autocast recipe: expected None or one of"):
        with autocast(recipe="mxfp8"):
            pass
    assert current_recipe() is None
