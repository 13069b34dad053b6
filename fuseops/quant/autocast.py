"""``fuseops.autocast(recipe=...)``: the recipe that quantized compute uses in a block."""

import contextlib as _contextlib
import threading as _threading
from collections.abc import Iterator as _Iterator

from fuseops.quant.recipes import Recipe as _Recipe
from fuseops.quant.recipes import check_recipe as _check_recipe

__all__ = ["autocast", "current_recipe"]

_state = _threading.local()


def current_recipe() -> _Recipe | None:
    """The innermost active recipe, or None for unquantized compute."""
    return getattr(_state, "recipe", None)


@_contextlib.contextmanager
def autocast(recipe: _Recipe | None = None) -> _Iterator[None]:
    """Run fuseops ops inside this block with ``recipe``; nestable, ``None`` disables.

    Args:
        recipe: a ``fuseops.recipes`` instance (e.g. ``MXFP8()``), or None for unquantized
            compute in the input dtype.
    """
    recipe = _check_recipe("autocast recipe", recipe)
    previous = current_recipe()
    _state.recipe = recipe
    try:
        yield
    finally:
        _state.recipe = previous
