"""One CUDA-graph memory pool per device, shared by the recorded programs' graphs (issue 20).

In a private pool, a graph holds for good all the memory its capture allocated: its results and
every intermediate (session 41: with the GPU-bound programs graphed too, 1.7x the eager step's
peak reserved memory). In one shared pool, a capture reuses what earlier captures freed at their
end, so the graphs together hold about what eager runs do: their results plus the intermediates
of the largest.

What sharing must not break: a replay writes wherever its capture allocated (its *write set*),
and a later capture may have placed another graph's results there.

- A capture records its write set: the address ranges it allocated, read from the caching
  allocator's history, turned on for the capture alone (its alloc events on the capturing
  stream: ``allocations``). Where the caller records that history already (a memory profile:
  its events would end up in their trace and ours in theirs), or the allocator keeps none
  (``cudaMallocAsync``), the graph gets a private pool instead.
- A graph captured later whose results lie in an earlier graph's write set is noted in the
  earlier graph's ``clobbers`` (``SharedPool.admit``). The earlier graph replays only while none
  of those results is alive (``clobbered``: their storages' use counts, as a graph reads its
  own; after the later graph is captured again or freed, a weak reference to the storage, so
  that a result kept past its graph's life is never written over); otherwise its call runs
  eagerly, and one that keeps meeting them is captured again around them, after
  ``graphed.SHARED_CAPTURES`` such captures into a private pool (``graphed.py``). Results held
  when a graph is captured are outside its write set (the allocator never hands out a live
  block), so only later captures need checking.
- Replays in one pool run in stream order (two graphs' intermediates may share memory): a
  replay on another stream than the pool's last waits for that stream (``in_order``).
- A pool lives while one of its graphs does. A small *sentinel* graph keeps it alive while
  programs come and go (capturing into a pool whose graphs were all freed fails in
  ``capture_begin``, after torch has marked the random generator as capturing: session 24).
  When no program holds a graph in it, the pool is released (its memory goes back at
  ``torch.cuda.empty_cache``) and the next capture starts a new one.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

# A write set: sorted, disjoint (start, end) address ranges.
Ranges = tuple[tuple[int, int], ...]


class Result:
    """A graph's result, as another graph's ``clobbers`` names it: whether a tensor over it lives."""

    __slots__ = ("capture_id", "k", "owner", "weak")

    def __init__(self, owner: Any, k: int, storage: torch.UntypedStorage) -> None:
        self.owner, self.capture_id, self.k = weakref.ref(owner), owner.capture_id, k
        self.weak = StorageWeakRef(storage)

    def current(self) -> bool:
        """Whether its graph is the one captured then (it may hand the result out again)."""
        owner = self.owner()
        return owner is not None and owner.capture_id == self.capture_id

    def alive(self) -> bool:
        """Whether a tensor over it lives: beyond its graph's own references while that graph is
        current (its storage's use count, as a graph reads its own), any after."""
        owner = self.owner()
        if owner is not None and owner.capture_id == self.capture_id:
            handle, alone = owner.alone[self.k]
            return torch._C._storage_Use_Count(handle) != alone
        return not self.weak.expired()

    def gone(self) -> bool:
        """Dead for good: no longer its graph's, and no tensor over it lives."""
        return not self.current() and self.weak.expired()


class SharedPool:
    """The graph memory pool of one device, and the programs holding a graph in it."""

    __slots__ = ("__weakref__", "device", "members", "raw_stream", "stream", "_flag", "_handle", "_sentinel")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Programs (``graphed.GraphedProgram``) whose graph lies in this pool, weakly.
        self.members: weakref.WeakSet[Any] = weakref.WeakSet()
        self.stream: torch.cuda.Stream | None = None
        self.raw_stream: int | None = None
        self._handle: Any = None
        self._sentinel: torch.cuda.CUDAGraph | None = None
        self._flag: torch.Tensor | None = None

    def handle(self) -> Any:
        """The pool's handle for ``capture_begin``, with its sentinel graph captured on first use.
        Called on the capturing stream, before the capture's allocations are recorded."""
        if self._handle is None:
            handle = torch.cuda.graph_pool_handle()
            flag = torch.zeros(1, device=self.device)
            sentinel = torch.cuda.CUDAGraph()
            sentinel.capture_begin(pool=handle, capture_error_mode="thread_local")
            try:
                flag.zero_()
            finally:
                sentinel.capture_end()
            self._handle, self._sentinel, self._flag = handle, sentinel, flag
        return self._handle

    def admit(self, newcomer: Any) -> None:
        """``newcomer`` (just captured, its results held: ``storages``, ``alone``) joins; each
        earlier member's ``clobbers`` gains the newcomer's results in its write set."""
        fresh = [(Result(newcomer, k, s), s.data_ptr(), s.data_ptr() + s.nbytes())
                 for k, s in enumerate(newcomer.storages)]
        for member in list(self.members):
            if member is newcomer:
                continue
            member.clobbers = [c for c in member.clobbers if not c.gone()]
            member.clobbers.extend(r for r, start, end in fresh if overlaps(member.writes, start, end))
        self.members.add(newcomer)

    def leave(self, program: Any) -> None:
        """``program``'s graph is freed; with no graph left in it, the pool is released."""
        self.members.discard(program)
        if not self.members:
            self._handle = self._sentinel = self._flag = None
            self.stream = self.raw_stream = None

    def in_order(self) -> None:
        """Before a replay: the current stream waits for the stream of the pool's last replay
        where they differ (one raw-stream read otherwise)."""
        if self.device.type != "cuda":
            return
        raw = torch._C._cuda_getCurrentRawStream(self.device.index)
        if raw != self.raw_stream:
            current = torch.cuda.current_stream(self.device)
            if self.stream is not None:
                current.wait_stream(self.stream)
            self.stream, self.raw_stream = current, raw


# Per device (type, index): the shared pool, created at the first capture there.
_pools: dict[tuple[str, int | None], SharedPool] = {}


def for_device(device: torch.device) -> SharedPool:
    """The shared pool of ``device`` ("cuda" without an index: the current device's)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device.type, device.index)
    if key not in _pools:
        _pools[key] = SharedPool(device)
    return _pools[key]


def clobbered(clobbers: Sequence[Result]) -> bool:
    """Whether a result named in ``clobbers`` (a later graph's, in this graph's write set) is
    alive: this graph's replay would overwrite it."""
    for r in clobbers:
        if r.alive():
            return True
    return False


def overlaps(ranges: Ranges, start: int, end: int) -> bool:
    """Whether ``[start, end)`` meets one of ``ranges`` (sorted and disjoint)."""
    i = bisect.bisect_left(ranges, (end,))
    return i > 0 and ranges[i - 1][1] > start


def write_set(trace: Sequence[dict], stream: int) -> Ranges:
    """The ranges allocated on ``stream`` in an allocator trace (``torch.cuda.memory._snapshot``'s
    ``device_traces``), merged."""
    spans = sorted((e["addr"], e["addr"] + e["size"]) for e in trace
                   if e["action"] == "alloc" and e["stream"] == stream)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


# One recording at a time: the history is the process's, and a second capture turning it on (with
# its ``clear_history``) or off in the middle of another's would lose that one's events (the
# autograd engine runs the backward of each device on its own thread).
_recording = threading.Lock()


class Allocations:
    """What ``allocations`` found: ``ranges``, the write set (None: not recorded)."""

    __slots__ = ("ranges",)

    def __init__(self) -> None:
        self.ranges: Ranges | None = None


def can_share() -> bool:
    """Whether a capture can go to the shared pool: the write set is read from the native
    caching allocator's history (``cudaMallocAsync`` keeps none), which the caller must not be
    recording already. (CUDA must be initialised: torch 2.11 crashes otherwise.)"""
    return torch.cuda.get_allocator_backend() == "native" and not torch._C._cuda_isHistoryEnabled()


@contextlib.contextmanager
def allocations(device: torch.device, stream: torch.cuda.Stream) -> Iterator[Allocations]:
    """The address ranges allocated on ``stream`` inside the block, in the yielded object's
    ``ranges`` once the block has exited (the allocator's history, on for the block alone)."""
    found = Allocations()
    with _recording:
        torch.cuda.memory._record_memory_history("all", context=None, stacks="python", clear_history=True)
        try:
            yield found
            trace = torch.cuda.memory._snapshot(device)["device_traces"][device.index]
        finally:
            torch.cuda.memory._record_memory_history(None)
    found.ranges = write_set(trace, stream.cuda_stream)
