"""What the scheduler keeps per saved tensor, per storage and per group; skip reasons
and the stats they feed."""

from __future__ import annotations

import enum
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef


class Skip(enum.Enum):
    """Why a saved tensor stayed on the device (``stats["skipped_<value>"]``)."""

    PARAMETER = "parameter"  # an nn.Parameter, or a view of one (a transposed weight)
    LEAF = "leaf"  # another leaf that requires grad: autograd keeps it alive anyway
    BUFFER = "buffer"  # a buffer of a module called inside the context
    MARKED = "marked"  # mark_not_offload
    SMALL = "small"  # its storage is under min_tensor_bytes
    UNSUPPORTED = "unsupported"  # not a plain strided tensor on a CPU or CUDA device
    KEPT = "kept"  # in one of the last keep_last groups
    BUDGET = "budget"  # over the group's byte budget
    DISABLED = "disabled"  # inside offload_activations(enabled=False)


def new_stats() -> dict[str, int | str]:
    stats = dict.fromkeys(
        ("bytes_offloaded", "bytes_reloaded", "tensors_offloaded", "tensors_skipped",
         "storages_offloaded", "groups", "groups_planned", "planned_bytes", "planned_bytes_per_s",
         "planned_flops_per_s", "bytes_for_target", "peak_bytes", "peak_lowest_bytes",
         "peak_offload_can_lower"), 0)
    stats["peak_where"] = ""
    stats.update({f"skipped_{s.value}": 0 for s in Skip})
    return stats


# The stats key of each reason, built once: a skip is counted per saved tensor.
_SKIP_KEYS = {s: f"skipped_{s.value}" for s in Skip}


def count_skip(stats: dict[str, int], reason: Skip, n: int = 1) -> None:
    stats["tensors_skipped"] += n
    stats[_SKIP_KEYS[reason]] += n


class Where(enum.Enum):
    DEVICE = "device"  # the original storage (not offloaded, or not yet)
    HOST = "host"  # in a host block, on its way or arrived
    RELOADED = "reloaded"  # copied back into a fresh device buffer


class Stored:
    """One storage saved in a group. On the device, ``alias`` (a detached alias of the
    first tensor saved from it: same storage, same version counter) holds it; on the
    host, ``host``; reloaded, ``data`` (a flat uint8 buffer). ``event`` orders the copy
    that filled the current place; ``version`` is the version autograd saw. ``release``:
    what must run if the record dies where it is (its host block given back, or a wait
    for its reload), called by ``__del__``; ``None`` once nothing is owed. A slot and
    ``__del__`` rather than a ``weakref.finalize`` per copy: the host runs this per
    storage moved, twice per step, and a finalizer costs a registry entry each time."""

    __slots__ = ("group", "device", "nbytes", "version", "ref", "alias", "data", "host", "event",
                 "where", "decided", "outcome", "handles", "modified", "consumed", "release",
                 "__weakref__")

    def __init__(self, group: Group, t: torch.Tensor, storage: torch.UntypedStorage) -> None:
        self.group = group
        self.device = t.device
        self.nbytes = storage.nbytes()
        self.version = t._version
        self.ref = StorageWeakRef(storage)
        self.alias: torch.Tensor | None = t.detach()
        self.data: torch.Tensor | None = None
        self.host = None
        self.event = None
        self.where = Where.DEVICE
        self.decided = False
        self.outcome: Skip | None = None
        self.handles = 0
        self.modified = False
        self.consumed = False
        self.release: Callable[[], Any] | None = None

    def __del__(self) -> None:
        release = self.release
        if release is not None:
            self.release = None
            # At interpreter exit the arena and the device may be gone: nothing is owed.
            if not sys.is_finalizing():
                release()

    def storage(self) -> torch.UntypedStorage:
        return (self.alias if self.where is Where.DEVICE else self.data).untyped_storage()

    def check_version(self) -> None:
        """Autograd's own check, which saved-tensor hooks switch off: a saved tensor
        modified in place while on the device, or before its copy out settled, is an
        error rather than a silently wrong gradient. (Once settled, the host copy holds
        the value the forward saved, and backward uses that.)"""
        if self.alias is not None and self.alias._version != self.version:
            self.modified = True
        if self.modified:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: a tensor saved inside offload_activations (storage of "
                f"{self.nbytes} bytes on {self.device}) was at version {self.version} when saved"
            )


class SavedTensor:
    """What autograd keeps for one saved tensor: its record and how to view it."""

    __slots__ = ("stored", "group", "dtype", "size", "stride", "offset")

    def __init__(self, stored: Stored, group: int, t: torch.Tensor) -> None:
        self.stored, self.group = stored, group
        self.dtype, self.size, self.stride, self.offset = t.dtype, t.shape, t.stride(), t.storage_offset()


class Passed:
    """What autograd keeps for a tensor of a group that moves nothing: the tensor itself,
    its version when saved (saved-tensor hooks switch autograd's own in-place check off,
    so ``check_version`` does it) and its group (whose first unpack still marks the
    group's backward)."""

    __slots__ = ("group", "tensor", "version", "key")

    def __init__(self, group: Group, tensor: torch.Tensor, key: int | None = None) -> None:
        self.group, self.tensor, self.version = group, tensor, tensor._version
        # Passed for being over its group's cap: the storage's key in ``group.over_cap``.
        self.key = key

    def check_version(self) -> None:
        """A tensor modified in place after it was saved is an error, as autograd makes it
        without hooks, never a silently wrong gradient."""
        if self.tensor._version != self.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: a tensor saved inside offload_activations ({tuple(self.tensor.shape)} "
                f"on {self.tensor.device}) was at version {self.version} when saved and is now at "
                f"version {self.tensor._version}"
            )


class Group:
    """Saved storages of one group, in save order; ``index`` is set by the first one."""

    def __init__(self) -> None:
        self.index = -1
        self.records: list[weakref.ref[Stored]] = []
        self.devices: set[torch.device] = set()
        self.fences: dict[torch.device, Any] = {}
        self.offloading = False
        self.kept = False
        self.backward_started = False
        # Backward: bytes of this group's records consumed so far, and the group to
        # prefetch once they reach ``prefetch_at``.
        self.consumed = 0
        self.prefetch: Group | None = None
        self.prefetch_at = 0
        # Streamed prefetch: bytes free beside what this group consumes, and bytes issued
        # (``None``: the whole group at ``prefetch_at``).
        self.prefetch_room: int | None = None
        self.prefetch_issued = 0
        # Streamed prefetch: (records of the target not yet walked, counted from the
        # start; the target's record count then), see ``BackwardPath._advance_prefetch`` (backward.py).
        self.prefetch_walk = (0, -1)
        self.budget_left: int | None = None
        # Bytes of each storage saved that may move, by storage key, in save order, and
        # their sum; forward FLOPs of the modules called in the group (estimate.py); bytes
        # of the weight gradients its backward allocates; bytes it moved (peak.py).
        self.sizes: dict[int, int] = {}
        self.saved = 0
        self.flops = 0
        # FLOPs of fuseops Sequentials that a module called in the group holds but had not
        # called by then (an expert layer's experts), by the Sequential's id (plan.py).
        self.held_flops: dict[int, int] = {}
        self.grads = 0
        self.moved = 0
        # Moves nothing (see ``Scheduler._pass``): tensors passed through, not yet counted.
        self.passthrough = False
        self.passed = 0
        # Storages over the group's cap, passed through (``Scheduler._pass_over_cap``):
        # tensors not yet counted, bytes by storage key not yet consumed, and their total.
        self.passed_over_cap = 0
        self.over_cap: dict[int, int] = {}
        self.over_cap_bytes = 0

    def live(self) -> list[Stored]:
        """Records still alive that belong to this group (a record may have moved on)."""
        return [r for ref in self.records if (r := ref()) is not None and r.group is self]

    # Walked at each group's backward start: no list of live records built first.
    def on_host(self) -> list[Stored]:
        """The live records of this group that are on the host."""
        return [r for ref in self.records if (r := ref()) is not None and r.group is self and r.where is Where.HOST]

    def live_bytes(self, on_host: bool = False) -> int:
        """Bytes of the live records of this group (only those on the host: ``on_host``)."""
        total = 0
        for ref in self.records:
            r = ref()
            if r is not None and r.group is self and (not on_host or r.where is Where.HOST):
                total += r.nbytes
        return total
