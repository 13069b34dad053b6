"""``fuseops.autocast(recipe=...)``: the recipe that quantized compute uses in a block."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_state = threading.local()


def current_recipe() -> Any:
    """The innermost active recipe, or None for unquantized compute."""
    return getattr(_state, "recipe", None)


@contextlib.contextmanager
def autocast(recipe: Any = None) -> Iterator[None]:
    """Run fuseops ops inside this block with ``recipe``; nestable, ``None`` disables."""
    previous = current_recipe()
    _state.recipe = recipe
    try:
        yield
    finally:
        _state.recipe = previous
