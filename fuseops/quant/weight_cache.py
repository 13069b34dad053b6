"""Copies derived from a parameter (its cast under ``torch.autocast``, a recipe's quantized
weight and column-wise copy), made once per weight version instead of once per call.

An entry is valid while the parameter keeps its storage (``data_ptr``), shape, dtype and
version counter: an optimizer's in-place step bumps the version, ``param.data = ...``,
``module.to(...)`` and FSDP-style re-allocation change the storage, ``load_state_dict``
copies in place (a version bump). When any of these changed, every copy made from the old
weight is dropped together, so a stale copy is never returned. Micro-batches of gradient
accumulation, activation recompute and the backward of one step share one copy.

The cache holds no strong reference to a parameter (``WeakIdKeyDictionary``): a freed
parameter frees its copies. ``cached_bytes()`` reports what the copies hold; ``clear()``
drops them all. Under ``torch.compile`` nothing is cached (the compiler sees the plain
computation and may fuse it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.utils.weak import WeakIdKeyDictionary

T = TypeVar("T")


@dataclass
class _Entry:
    # What the copies were made from; all of it must still hold for them to be used.
    stamp: tuple[int, int, tuple[int, ...], torch.dtype]
    copies: dict[Hashable, Any] = field(default_factory=dict)


_entries: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _stamp(param: torch.Tensor) -> tuple[int, int, tuple[int, ...], torch.dtype]:
    return (param.data_ptr(), param._version, tuple(param.shape), param.dtype)


def derived(param: torch.Tensor, kind: Hashable, build: Callable[[torch.Tensor], T], *, enabled: bool = True) -> T:
    """``build(param)``, reused while ``param`` is unchanged.

    Args:
        param: the parameter (any tensor whose version counter tracks its writes).
        kind: what the copy is (e.g. ``("cast", torch.bfloat16)``, or a quantized format and
            layout); copies of different kinds are kept side by side.
        build: makes the copy from ``param``; called under ``torch.no_grad()``, since the
            ops compute parameter gradients themselves.
        enabled: ``False`` builds every time and leaves the cache untouched (a recipe's
            ``cache_weights=False``).
    """
    if not enabled or torch.compiler.is_compiling():
        with torch.no_grad():
            return build(param)
    stamp = _stamp(param)
    entry = _entries.get(param)
    if entry is None or entry.stamp != stamp:
        entry = _entries[param] = _Entry(stamp)
    copy = entry.copies.get(kind)
    if copy is None:
        with torch.no_grad():
            copy = entry.copies[kind] = build(param)
    return copy


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "data_tensors"):
        return list(value.data_tensors())
    return []


def cached_bytes() -> int:
    """Bytes held by every cached copy (each storage counted once)."""
    seen: dict[int, int] = {}
    for entry in list(_entries.values()):
        for copy in entry.copies.values():
            for t in _tensors(copy):
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def clear() -> None:
    """Drop every cached copy."""
    _entries.clear()
