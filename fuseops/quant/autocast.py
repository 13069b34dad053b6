"""``fuseops.autocast(recipe=...)``: the recipe that quantized compute uses in a block."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from fuseops.quant.recipes import Recipe, check_recipe

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
