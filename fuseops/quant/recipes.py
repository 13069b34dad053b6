"""Quantization recipes: which format each tensor of a GEMM is quantized to (API.md).

A recipe is a frozen (hashable) dataclass: the fuser caches plans per recipe. Its
``format(role)`` says how to quantize the GEMM inputs (``TensorRole.INPUT``), the weights
(``WEIGHT``) and the output gradients (``GRAD``); the maths of each format is in
``fuseops/kernels/quantization/formats.py``.

| recipe | elements | scales |
| --- | --- | --- |
| ``FP8CurrentScaling()`` | E4M3; gradients ``grad_dtype`` (E5M2) | one float32 per tensor, from its amax |
| ``FP8Blockwise()`` | E4M3; gradients ``grad_dtype`` (E5M2) | power-of-two float32 per 1x128 (inputs, gradients) or 128x128 (weights) |
| ``MXFP8()`` | E4M3; gradients ``grad_dtype`` (E5M2) | E8M0 per 32 elements along the reduction dim |
| ``NVFP4()`` | E2M1 | E4M3 per 16 elements, plus one float32 per tensor |

Hopper has no MX or FP4 tensor cores: MXFP8 and NVFP4 GEMMs dequantize tiles in the kernel
and multiply in bf16 (emulation: the numerics of the format, not its speed).
"""

import abc
import enum
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from fuseops.exported_names import exported_dir
from fuseops.kernels.quantization.formats import BLOCK_SIZE, Element, Scaling, element_of

__all__ = [
    "MXFP8",
    "NVFP4",
    "RECIPES",
    "Element",
    "FP8Blockwise",
    "FP8CurrentScaling",
    "QuantFormat",
    "Recipe",
    "RecipeKind",
    "Scaling",
    "TensorRole",
    "as_role",
    "check_recipe",
]


class RecipeKind(enum.Enum):
    FP8_CURRENT_SCALING = "fp8_current_scaling"
    FP8_BLOCKWISE = "fp8_blockwise"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


class TensorRole(enum.Enum):
    """Which GEMM input a tensor is: it decides the element type and the block shape."""

    INPUT = "input"
    WEIGHT = "weight"
    GRAD = "grad"


@dataclass(frozen=True)
class QuantFormat:
    """One tensor's format: how scales apply, the element type, and (BLOCK only) whether
    blocks are 128x128 tiles instead of 1x128 rows."""

    scaling: Scaling
    element: Element
    block_2d: bool = False

    @property
    def block(self) -> int:
        """Elements per block along the quantized dim (0: one scale per tensor)."""
        return BLOCK_SIZE[self.scaling]


_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class Recipe(abc.ABC):
    """Base of the recipes; ``kind`` names the recipe.

    ``cache_weights`` (keyword only, default True): a GEMM's quantized weight and its
    column-wise copy are kept and re-quantized only when the parameter changes
    (``fuseops.quant.weight_cache``), so micro-batches, recompute and backward share one
    quantization per optimizer step; ``False`` quantizes at every use. Results are bit for
    bit the same either way."""

    kind: ClassVar[RecipeKind]
    cache_weights: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.cache_weights, bool):
            raise TypeError(f"{type(self).__name__} cache_weights: expected True or False, got {self.cache_weights!r}")

    @abc.abstractmethod
    def format(self, role: TensorRole) -> QuantFormat:
        """The format of a tensor playing ``role`` in a GEMM."""


@dataclass(frozen=True)
class _FP8Recipe(Recipe):
    """E4M3 for inputs and weights, ``grad_dtype`` (float8_e5m2 or float8_e4m3fn) for gradients."""

    grad_dtype: torch.dtype = torch.float8_e5m2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.grad_dtype not in _FP8_DTYPES:
            raise ValueError(
                f"{type(self).__name__} grad_dtype: expected torch.float8_e5m2 or "
                f"torch.float8_e4m3fn, got {self.grad_dtype!r}"
            )

    def _element(self, role: TensorRole) -> Element:
        return element_of(self.grad_dtype) if role == TensorRole.GRAD else Element.E4M3


@dataclass(frozen=True)
class FP8CurrentScaling(_FP8Recipe):
    """Per-tensor float32 scales from the current tensor's absolute maximum."""

    kind: ClassVar[RecipeKind] = RecipeKind.FP8_CURRENT_SCALING

    def format(self, role: TensorRole) -> QuantFormat:
        return QuantFormat(Scaling.TENSOR, self._element(role))


@dataclass(frozen=True)
class FP8Blockwise(_FP8Recipe):
    """Power-of-two float32 scales per 1x128 block of inputs and gradients (along the
    reduction dim) and per 128x128 tile of weights."""

    kind: ClassVar[RecipeKind] = RecipeKind.FP8_BLOCKWISE

    def format(self, role: TensorRole) -> QuantFormat:
        return QuantFormat(Scaling.BLOCK, self._element(role), block_2d=role == TensorRole.WEIGHT)


@dataclass(frozen=True)
class MXFP8(_FP8Recipe):
    """OCP MX: E8M0 scales per 32 elements along the reduction dim. The scale is rounded up
    (the smallest power of two that keeps the block maximum in range), so no block saturates."""

    kind: ClassVar[RecipeKind] = RecipeKind.MXFP8

    def format(self, role: TensorRole) -> QuantFormat:
        return QuantFormat(Scaling.MX, self._element(role))


@dataclass(frozen=True)
class NVFP4(Recipe):
    """E2M1 elements in blocks of 16 with an E4M3 scale each, plus a float32 tensor scale."""

    kind: ClassVar[RecipeKind] = RecipeKind.NVFP4

    def format(self, role: TensorRole) -> QuantFormat:
        return QuantFormat(Scaling.NVFP4, Element.E2M1)


RECIPES = (FP8CurrentScaling, FP8Blockwise, MXFP8, NVFP4)


def check_recipe(name: str, recipe: object) -> Recipe | None:
    """``recipe`` if it is a recipe instance or None, else a TypeError naming ``name``."""
    if recipe is None or isinstance(recipe, Recipe):
        return recipe
    valid = ", ".join(f"fuseops.recipes.{r.__name__}()" for r in RECIPES)
    raise TypeError(f"{name}: expected None or one of {valid}, got {recipe!r}")


def as_role(role: TensorRole | str) -> TensorRole:
    """``role`` as a TensorRole; strings ("input", "weight", "grad") are accepted."""
    if isinstance(role, TensorRole):
        return role
    try:
        return TensorRole(role)
    except ValueError:
        valid = ", ".join(repr(r.value) for r in TensorRole)
        raise ValueError(f"role: expected a TensorRole or one of {valid}, got {role!r}") from None


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
