"""``fuseops.autocast(recipe=...)``: the recipe that quantized compute uses in a block."""

import contextlib
import threading
from collections.abc import Iterator

from fuseops.exported_names import exported_dir
from fuseops.quant.recipes import Recipe, check_recipe

__all__ = ["autocast", "current_recipe"]

_state = threading.local()


def current_recipe() -> Recipe | None:
    """The innermost active recipe, or None for unquantized compute."""
    return getattr(_state, "recipe", None)


@contextlib.contextmanager
def autocast(recipe: Recipe | None = None) -> Iterator[None]:
    """Run fuseops ops inside this block with ``recipe``; nestable, ``None`` disables.

    Args:
        recipe: a ``fuseops.recipes`` instance (e.g. ``MXFP8()``), or None for unquantized
            compute in the input dtype.
    """
    recipe = check_recipe("autocast recipe", recipe)
    previous = current_recipe()
    _state.recipe = recipe
    try:
        yield
    finally:
        _state.recipe = previous


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
