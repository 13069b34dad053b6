"""Integrations with other libraries. Each one is a submodule imported on demand and
activated by a call (``fuseops.integrations.transformers.register()``): importing
fuseops never imports, or changes, another library."""

import importlib
from types import ModuleType

_SUBMODULES = ("transformers",)


def __getattr__(name: str) -> ModuleType:
    # ``fuseops.integrations.transformers`` works after a plain ``import fuseops``; the
    # other library is imported only then.
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
