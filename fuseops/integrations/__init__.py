"""Integrations with other libraries. Each one is a submodule imported on demand and
activated by a call (``fuseops.integrations.transformers.register()``): importing
fuseops never imports, or changes, another library."""

import importlib
from types import ModuleType

from fuseops.exported_names import exported_dir

__all__ = ["transformers"]


def __getattr__(name: str) -> ModuleType:
    # ``fuseops.integrations.transformers`` works after a plain ``import fuseops``; the
    # other library is imported only then.
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
