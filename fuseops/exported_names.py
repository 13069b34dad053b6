"""What ``dir()`` of a public module or package lists: the names it exports (``__all__``) and its
private ones, not the modules and names it imports, nor the submodules that become a package's
attributes as they are imported. Each public module defines PEP 562's module ``__dir__`` with it."""

from __future__ import annotations

__all__ = ["exported_dir"]


def exported_dir(namespace: dict[str, object], exported: list[str]) -> list[str]:
    """``exported`` and the names of ``namespace`` (a module's ``globals()``) that start with ``_``."""
    return sorted(exported + [name for name in namespace if name.startswith("_")])
