"""Quantized compute: recipes, autocast, quantized storages, ``quantize`` and the quantized
linear GEMMs. Layers below: ``fuseops.kernels`` only."""

from fuseops.exported_names import exported_dir
from fuseops.quant import recipes, weight_cache
from fuseops.quant.autocast import autocast, current_recipe
from fuseops.quant.gemm import linear_dgrad, linear_forward, linear_wgrad
from fuseops.quant.quantize import quantize
from fuseops.quant.recipes import QuantFormat, Recipe, RecipeKind, TensorRole
from fuseops.quant.storage import GroupedQuantizedTensor, QuantizedTensor

__all__ = [
    "GroupedQuantizedTensor",
    "QuantFormat",
    "QuantizedTensor",
    "Recipe",
    "RecipeKind",
    "TensorRole",
    "autocast",
    "current_recipe",
    "linear_dgrad",
    "linear_forward",
    "linear_wgrad",
    "quantize",
    "recipes",
    "weight_cache",
]


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
