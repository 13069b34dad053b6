"""Storage sets: tensors kept on the device by the storage they live in.

A mark is held by storage, so every view of a marked tensor (a slice, a transpose, the
chunks of a gated activation's input) stays too. Entries are weak: a mark ends with its
storage, and a new storage that happens to reuse the address is not marked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef


class StorageSet:
    """A set of live storages, keyed by the storage, holding none of them alive."""

    def __init__(self) -> None:
        self._refs: dict[int, StorageWeakRef] = {}

    def add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        self._refs[storage._cdata] = StorageWeakRef(storage)
        # Forget dead storages now and then so the set tracks what is alive.
        if len(self._refs) > 64 and len(self._refs) & (len(self._refs) - 1) == 0:
            self._refs = {k: r for k, r in self._refs.items() if not r.expired()}

    def __contains__(self, storage: torch.UntypedStorage) -> bool:
        ref = self._refs.get(storage._cdata)
        return ref is not None and not ref.expired()

    def __len__(self) -> int:
        return sum(not r.expired() for r in self._refs.values())


_marked = StorageSet()


def mark_not_offload(*tensors: Any) -> None:
    """Keep these tensors (and every view of their storage) on the device.

    Args:
        *tensors: tensors, or quantized / grouped storages (any object with a
            ``data_tensors()`` method: each of its plain buffers is marked). ``None``
            is ignored, so optional fields can be passed as they are.

    A mark lasts as long as the storage and takes effect for any offload that has not
    started yet, also for a tensor already saved in a group that is still on device.
    """
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if isinstance(t, torch.Tensor):
            _marked.add(t)
        elif callable(getattr(t, "data_tensors", None)):
            for buffer in t.data_tensors():
                if buffer is not None:
                    _marked.add(buffer)
        else:
            raise TypeError(
                f"tensors[{i}]: expected a torch.Tensor or a storage with data_tensors(), "
                f"got {type(t).__name__}"
            )


def is_marked(storage: torch.UntypedStorage) -> bool:
    """Whether ``storage`` was marked with ``mark_not_offload`` and is still alive."""
    return storage in _marked
