"""Integrations with other libraries. Each one is a submodule imported on demand and
activated by a call (``fuseops.integrations.transformers.register()``): importing
fuseops never imports, or changes, another library."""

import importlib as _importlib
from types import ModuleType as _ModuleType

__all__ = ["transformers"]


def __getattr__(name: str) -> _ModuleType:
    # ``fuseops.integrations.transformers`` works after a plain ``import fuseops``; the
    # other library is imported only then.
    if name in __all__:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The integrations are listed before they are imported.
    return sorted(__all__ + [name for name in globals() if name.startswith("_")])
