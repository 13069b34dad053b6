"""Host memory for offloaded activations: blocks reused across steps.

A block is a flat uint8 tensor on the host, pinned when it backs CUDA copies. Sizes
are rounded up to a power of two, the rounding torch's pinned allocator applies anyway,
so a block's capacity is what it really costs and a step that saves the same shapes
as the last one finds every block it needs already free: after the first step no host
memory is allocated. A size with no free block takes the smallest larger one free. A block handed back carries the event of the last device copy
that reads it; the next user's copy stream waits on that event, never the host.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

# Small blocks are not worth a size class of their own.
MIN_BLOCK_BYTES = 4096


def block_capacity(nbytes: int) -> int:
    """The capacity of the block that holds ``nbytes`` (the next power of two)."""
    return max(MIN_BLOCK_BYTES, 1 << (max(nbytes, 1) - 1).bit_length())


@dataclass(eq=False)
class HostBlock:
    """``data``: uint8 [capacity] on the host. ``fence``: event the last device copy
    from it recorded (``None`` when no copy is pending or on a CPU device)."""

    data: torch.Tensor
    fence: Any = None
    # The last ``head`` asked for: (size, view). A block comes back for the same storage
    # size step after step, and each copy out and in reads it: a slice is a call into
    # torch and a new tensor, per storage moved, both ways.
    _head: tuple[int, torch.Tensor] | None = field(default=None, repr=False)
    # ``data.numel()``, read once (the arena reads it per take and give).
    capacity: int = field(init=False)

    def __post_init__(self) -> None:
        self.capacity = self.data.numel()

    def head(self, nbytes: int) -> torch.Tensor:
        """``data[:nbytes]``: the bytes a storage of ``nbytes`` occupies."""
        head = self._head
        if head is None or head[0] != nbytes:
            head = self._head = (nbytes, self.data[:nbytes])
        return head[1]


class HostArena:
    """Free lists of host blocks by capacity; grows only when no free block fits.

    Args:
        pinned: allocate page-locked memory (for asynchronous CUDA copies).
    """

    def __init__(self, *, pinned: bool) -> None:
        self.pinned = pinned
        self.allocations = 0
        self.reserved_bytes = 0
        self.lent_bytes = 0
        self._free: dict[int, list[HostBlock]] = {}
        # Blocks come back from the autograd engine's threads and from finalizers.
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> HostBlock:
        """A block of at least ``nbytes``; its ``fence`` must be waited on before writing."""
        capacity = block_capacity(nbytes)
        with self._lock:
            free = self._free.get(capacity)
            if not free:
                # A larger free block rather than a new one: a plan that shrinks (smaller
                # tensors move where larger ones did) allocates no pinned memory.
                larger = [c for c, blocks in self._free.items() if c > capacity and blocks]
                free = self._free[min(larger)] if larger else None
            block = free.pop() if free else None
            if block is None:
                self.allocations += 1
                self.reserved_bytes += capacity
            else:
                capacity = block.capacity
            self.lent_bytes += capacity
        if block is None:
            block = HostBlock(torch.empty(capacity, dtype=torch.uint8, pin_memory=self.pinned))
        return block

    def give(self, block: HostBlock, fence: Any = None) -> None:
        """Return ``block``; ``fence`` is the event of the last copy that reads it."""
        block.fence = fence
        with self._lock:
            self._free.setdefault(block.capacity, []).append(block)
            self.lent_bytes -= block.capacity

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(b.capacity for blocks in self._free.values() for b in blocks)

    def clear(self) -> None:
        """Release every free block (blocks still lent out are released when given back
        and cleared again)."""
        with self._lock:
            released = sum(b.capacity for blocks in self._free.values() for b in blocks)
            self._free.clear()
            self.reserved_bytes -= released


_arenas: dict[bool, HostArena] = {}


def host_arena(device: torch.device | str) -> HostArena:
    """The process-wide arena that backs offloads from ``device``: pinned for CUDA, plain
    host memory standing in for it on a CPU device."""
    pinned = torch.device(device).type == "cuda"
    if pinned not in _arenas:
        _arenas[pinned] = HostArena(pinned=pinned)
    return _arenas[pinned]
