"""Copies derived from a parameter (its cast under ``torch.autocast``, a recipe's quantized
weight and column-wise copy), made once per weight version instead of once per call.

An entry is valid while the parameter keeps its storage, its place in it (offset, shape,
strides), its dtype and its version counter, and no optimizer has stepped since it was
made:

- an optimizer's in-place step bumps the version (and ``torch.optim``'s fused kernels,
  which do not bump it, e.g. ``Adam(fused=True)``, run the step hook below);
- ``param.data = ...``, ``module.to(...)`` and ``load_state_dict(assign=True)`` change the
  storage; plain ``load_state_dict`` copies in place (a version bump);
- FSDP2-style re-sharding frees the storage (``untyped_storage().resize_(0)``) and re-fills
  it through the buffer the parameter is a view of: a view shares its base's version
  counter, so the re-fill bumps it (an unchanged weight is then re-quantized once per
  all-gather, never used stale).

The storage is compared by identity through a weak reference to it: holding that
reference keeps a freed storage's bookkeeping from being reused by the next allocation, so
a new storage that the allocator places at the old address is still a new storage (two
``param.data = ...`` in a row often land there, and the version counter stays the same).
Every ``torch.optim.Optimizer.step()`` of the process invalidates every entry (a global
step post-hook, registered when the first copy is cached): writes that bypass the version
counter after an optimizer's step, such as Megatron-style copies of float32 main weights
into ``param.data``, are seen too.

Not seen: writes through ``param.data`` (or another tensor aliasing the storage without
being an autograd view of the parameter) outside an optimizer step. After such a write call
``clear()``, or set the recipe's ``cache_weights=False``.

The cache holds no strong reference to a parameter (``WeakIdKeyDictionary``) nor to its
storage: a freed parameter frees its copies. ``cached_bytes()`` reports what the copies
hold; ``clear()`` drops them all. Under ``torch.compile`` and while a CUDA graph is being
captured nothing is cached or reused: the compiler sees the plain computation, and a graph
must contain the copy's kernels so that each replay makes it from the current weight.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.weak import WeakIdKeyDictionary

from fuseops.exported_names import exported_dir

__all__ = ["cached_bytes", "clear", "derived", "lookup"]

T = TypeVar("T")


@dataclass
class _Entry:
    # What the copies were made from; all of it must still hold for them to be used.
    storage: StorageWeakRef
    stamp: tuple
    copies: dict[Hashable, Any] = field(default_factory=dict)

    def matches(self, param: torch.Tensor, stamp: tuple) -> bool:
        return stamp == self.stamp and not self.storage.expired() and self.storage.cdata == param.untyped_storage()._cdata


_entries: WeakIdKeyDictionary = WeakIdKeyDictionary()
# Called as ``override(param, kind, build, enabled)`` in place of ``derived`` while set: the
# plain-autograd path (``fuseops.ops.executor.plain_autograd``) makes each copy differentiably.
override: Any = None
# Bumped by every optimizer step: entries made before it are stale.
_generation = 0


_step_hook: Any = None


def _optimizer_stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _generation
    _generation += 1


def _watch_optimizer_steps() -> None:
    """Register the step post-hook on the first cached copy (not at import: importing
    fuseops registers nothing); entries made before it cannot predate a step it missed."""
    global _step_hook
    if _step_hook is None:
        _step_hook = register_optimizer_step_post_hook(_optimizer_stepped)


def _stamp(param: torch.Tensor) -> tuple:
    return (_generation, param._version, param.storage_offset(), tuple(param.shape), param.stride(), param.dtype,
            param.device)


def _bypass(param: torch.Tensor) -> bool:
    """Whether nothing may be cached or reused for ``param`` now."""
    if torch.compiler.is_compiling():
        return True
    if param.is_cuda and torch.cuda.is_current_stream_capturing():
        return True
    # Tensors without a plain storage (wrapper subclasses, meta-like fakes) cannot be stamped.
    try:
        param.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return True
    return False


def _valid_entry(param: torch.Tensor) -> _Entry | None:
    entry = _entries.get(param)
    if entry is not None and entry.matches(param, _stamp(param)):
        return entry
    return None


def lookup(param: torch.Tensor, kind: Hashable) -> Any | None:
    """The copy of ``kind`` cached for ``param``'s current version, or None (nothing is
    built). Lets a caller use a copy that holds more than it needs (the quantized weight
    with its column-wise copy where the row-wise one alone was asked for)."""
    if _bypass(param):
        return None
    entry = _valid_entry(param)
    return None if entry is None else entry.copies.get(kind)


def derived(param: torch.Tensor, kind: Hashable, build: Callable[[torch.Tensor], T], *, enabled: bool = True) -> T:
    """``build(param)``, reused while ``param`` is unchanged.

    Args:
        param: the parameter (any tensor whose version counter tracks its writes).
        kind: what the copy is (e.g. ``("cast", torch.bfloat16)``, or a quantized format and
            layout); copies of different kinds are kept side by side.
        build: makes the copy from ``param``; called under ``torch.no_grad()``, since the
            ops compute parameter gradients themselves. The copy must not be written to
            afterwards: every user of this version shares it.
        enabled: ``False`` builds every time and leaves the cache untouched (a recipe's
            ``cache_weights=False``).
    """
    if override is not None:
        return override(param, kind, build, enabled)
    return _cached_copy(param, kind, build, enabled)


def _cached_copy(param: torch.Tensor, kind: Hashable, build: Callable[[torch.Tensor], T], enabled: bool) -> T:
    """``derived`` without the ``override`` hook."""
    if not enabled or _bypass(param):
        with torch.no_grad():
            return build(param)
    _watch_optimizer_steps()
    entry = _valid_entry(param)
    if entry is None:
        entry = _entries[param] = _Entry(StorageWeakRef(param.untyped_storage()), _stamp(param))
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
    """Bytes held by every cached copy (each storage counted once). Also
    ``fuseops.weight_cache.cached_bytes()``."""
    seen: dict[int, int] = {}
    for entry in list(_entries.values()):
        for copy in entry.copies.values():
            for t in _tensors(copy):
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def clear() -> None:
    """Drop every cached copy (after writing a weight in a way the cache cannot see:
    through ``param.data`` outside an optimizer step)."""
    _entries.clear()


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
