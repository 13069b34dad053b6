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
- **Dead results are reused** (where the allocator's pool checkpoints exist: CUDA, as torch's
  CUDA-graph trees use them). A graph's results go out over storages that do not own their
  memory, so the allocator sees it free once the capture is over; before the next capture
  (``reclaim``) the pool is set back to its state after the last one (``admit``'s checkpoint),
  every result then allocated, and those dead now are given back: the capture may place its
  own there (a backward's weight gradients where a forward's activations lay, freed by
  autograd), never over a live one. A later graph whose write set holds an earlier graph's
  result dead at its capture is noted the other way round (the newcomer's ``clobbers``): it
  replays only while that result is dead again. A result given back and handed out again by
  its graph's next replay lies in memory the allocator sees free, and no checkpoint has it
  allocated (session 47, call 11: a capture placed its memory over such a result, its own
  input, and its checking replay wrote there): before a capture the free blocks such live
  results lie in are taken by *placeholders* (``cover``: allocations in the pool of each
  block's size, in 1 MiB pieces in the allocator's small pool, which its best fit hands out
  from the block's start: session 48, run 2), given back at a later capture
  once no live result lies in them; a capture whose write set still meets a live result is
  dropped unreplayed (``exposed``, ``graphed.py``). Without checkpoints (CPU stand-ins), a
  graph's results keep their memory while its graph lives.
- A pool lives while one of its graphs, or a result one handed out, does. A small *sentinel*
  graph keeps it alive while programs come and go (capturing into a pool whose graphs were all
  freed fails in ``capture_begin``, after torch has marked the random generator as capturing:
  session 24). When no program holds a graph in it and no result lives, the pool is released
  (its memory goes back at ``torch.cuda.empty_cache``) and the next capture starts a new one:
  checked as a program leaves, at ``graphed.free`` and after each garbage collection (a model
  freed in a reference cycle leaves while the cycle still holds its results).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

# A write set: sorted, disjoint (start, end) address ranges.
Ranges = tuple[tuple[int, int], ...]


class Result:
    """A result a graph of the pool hands out: the memory it covers, whether it lives, and where
    the allocator stands with it (``SharedPool.reclaim``)."""

    __slots__ = ("allocated", "capture_id", "end", "holds", "in_checkpoint", "k", "owner", "start", "weak")

    def __init__(self, owner: Any, k: int, storage: torch.UntypedStorage) -> None:
        self.owner, self.capture_id, self.k = weakref.ref(owner), owner.capture_id, k
        self.start = storage.data_ptr()
        self.end = self.start + storage.nbytes()
        self.weak = StorageWeakRef(storage)
        # Its block: allocated in the pool's last checkpoint; allocated now, owned by nobody, kept
        # by the last ``reclaim`` (this entry gives it back). Its memory allocated now (its own
        # block or another's kept: no capture places anything there).
        self.in_checkpoint = True
        self.holds = False
        self.allocated = False

    def current(self) -> bool:
        """Whether its graph is the one captured then (its program may replay it again)."""
        owner = self.owner()
        return owner is not None and owner.capture_id == self.capture_id

    def alive(self) -> bool:
        """Whether a tensor over it lives: beyond its graph's own references while that graph is
        current (as a graph reads its own), any after."""
        owner = self.owner()
        if owner is not None and owner.capture_id == self.capture_id:
            handle, alone = owner.alone[self.k]
            return torch._C._storage_Use_Count(handle) != alone
        return not self.weak.expired()

    def gone(self) -> bool:
        """Dead for good: no longer its graph's, and no tensor over it lives."""
        return not self.current() and self.weak.expired()


class Placeholder:
    """A free block of the pool taken before a capture because a live result lies in it
    (``SharedPool.cover``): held until the capture's checkpoint, then given back once no live
    result lies in it (as a dead result's block)."""

    __slots__ = ("allocated", "end", "holds", "in_checkpoint", "start", "tensor")

    def __init__(self, tensor: Any) -> None:
        self.tensor, self.start = tensor, tensor.data_ptr()
        self.end = self.start + tensor.nbytes
        self.in_checkpoint = self.holds = False
        self.allocated = True

    def alive(self) -> bool:
        return False

    def current(self) -> bool:
        return False


def reuses_dead_results(device: torch.device) -> bool:
    """Whether the pool of ``device`` can set its allocator state back to a checkpoint."""
    return device.type == "cuda" and hasattr(torch._C, "_cuda_setCheckpointPoolState")


# The allocator's pool checkpoints (stand-ins in the CPU tests).
def checkpoint_state(device: torch.device, handle: Any) -> Any:
    return torch._C._cuda_getCheckpointState(device.index, handle)


def restore_state(device: torch.device, state: Any) -> None:
    # Every block of the state allocated, owned by nobody (no storage gets its deleter back).
    torch._C._cuda_setCheckpointPoolState(device.index, state, [], [])


def give_back(address: int) -> None:
    torch._C._cuda_cudaCachingAllocator_raw_delete(address)


def free_blocks(device: torch.device, handle: Any, stream: int) -> list[tuple[int, int, bool]]:
    """The (start, end, small) of each free block of the pool ``handle`` on ``stream``; ``small``:
    in a segment of the allocator's small pool (its requests at most ``SMALL_REQUEST``)."""
    found = []
    for segment in torch.cuda.memory_snapshot():
        if (segment["device"] != device.index or segment["stream"] != stream
                or tuple(segment.get("segment_pool_id", ())) != tuple(handle)):
            continue
        address, small = segment["address"], segment.get("segment_type") == "small"
        for block in segment["blocks"]:
            if block["state"] == "inactive":
                found.append((address, address + block["size"], small))
            address += block["size"]
    return found


def allocate_in_pool(device: torch.device, handle: Any, stream: torch.cuda.Stream, nbytes: int) -> Any:
    """``nbytes`` allocated in the pool ``handle`` on ``stream`` (the allocator's best fit)."""
    torch._C._cuda_beginAllocateCurrentThreadToPool(device.index, handle)
    try:
        with torch.cuda.stream(stream):
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
    finally:
        torch._C._cuda_endAllocateToPool(device.index, handle)
        torch._C._cuda_releasePool(device.index, handle)


# The largest request the caching allocator serves from its small pool (its 2 MiB segments): a
# free block there larger than this is taken in pieces (session 48, run 2: a cover asking for
# such a block whole got memory of the large pool, eight times over, and the capture was dropped).
SMALL_REQUEST = 1 << 20
# Allocations a cover may make for one free block (blocks of the asked size at lower addresses,
# or larger ones smaller than this one, come first: the allocator's best fit).
PLACEHOLDER_TRIES = 8


class SharedPool:
    """The graph memory pool of one device, the programs holding a graph in it and the results
    their graphs handed out."""

    __slots__ = ("__weakref__", "_flag", "_handle", "_placeholders", "_sentinel", "_state", "device", "members",
                 "raw_stream", "results", "reuses", "stream")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Programs (``graphed.GraphedProgram``) whose graph lies in this pool, weakly.
        self.members: weakref.WeakSet[Any] = weakref.WeakSet()
        # Every result a member's graph handed out that may live (``Result``), and the blocks
        # taken for live ones (``Placeholder``): what ``reclaim`` gives back or keeps.
        self.results: list[Result | Placeholder] = []
        self._placeholders: list[Placeholder] = []
        self.reuses = reuses_dead_results(device)
        self.stream: torch.cuda.Stream | None = None
        self.raw_stream: int | None = None
        self._handle: Any = None
        self._sentinel: torch.cuda.CUDAGraph | None = None
        self._flag: torch.Tensor | None = None
        # The allocator's state of the pool after the last capture (``reuses``).
        self._state: Any = None

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

    def reclaim(self) -> None:
        """Before a capture into the pool (``reuses``): the allocator's state set back to the
        last capture's, the blocks of results in it kept allocated where a live result lies in
        them (nothing is placed over it), the others given back (the capture may reuse them)."""
        if not self.reuses or self._state is None:
            return
        # The last cover's placeholders freed first: the restore frees what it finds allocated.
        for p in self._placeholders:
            p.tensor = None
        self._placeholders = []
        restore_state(self.device, self._state)
        live = [r for r in self.results if r.alive()]
        for r in self.results:
            r.holds = r.in_checkpoint and any(meets(r, other) for other in live)
            if r.in_checkpoint and not r.holds:
                give_back(r.start)
        held = [r for r in self.results if r.holds]
        for r in self.results:
            r.allocated = _covered(r, held)
        # Kept: results that live or may live again (their graph's next replay), blocks to give back.
        self.results = [r for r in self.results if r.holds or r.current() or r in live]

    def cover(self, stream: torch.cuda.Stream) -> None:
        """After ``reclaim``, on the capturing stream: every free block a live result lies in
        (one handed out again after its memory was given back) taken by a placeholder, so that
        the capture places nothing there."""
        exposed = [r for r in self.results if r.alive() and not r.allocated]
        if not exposed:
            return
        for start, end, small in free_blocks(self.device, self._handle, stream.cuda_stream):
            if any(r.start < end and start < r.end for r in exposed):
                self._take(start, end, small, stream)
        taken = [p for p in self._placeholders if p.tensor is not None]
        for r in exposed:
            r.allocated = _covered(r, taken)

    def _take(self, start: int, end: int, small: bool, stream: torch.cuda.Stream) -> None:
        """The free block ``[start, end)`` taken by placeholders, from its start: each asks for
        what is left of it (at most ``SMALL_REQUEST`` in the small pool), which the allocator's
        best fit hands out from the block's start once no better fit is left elsewhere."""
        at = start
        for _ in range(PLACEHOLDER_TRIES):
            if at >= end:
                return
            nbytes = min(end - at, SMALL_REQUEST) if small else end - at
            p = Placeholder(allocate_in_pool(self.device, self._handle, stream, nbytes))
            self._placeholders.append(p)
            self.results.append(p)
            if p.start == at:
                at = p.end

    def exposed(self, writes: Ranges) -> bool:
        """Whether a capture's write set meets a live result it was not kept from (a cover that
        did not get its block): its checking replay would write over it. (Without reuse, live
        results own their memory.)"""
        return self.reuses and any(not r.allocated and r.alive() and overlaps(writes, r.start, r.end)
                                   for r in self.results)

    def admit(self, newcomer: Any) -> None:
        """``newcomer`` (just captured, its results held: ``storages``, ``alone`` once it has
        disowned them) joins. Each earlier member's ``clobbers`` gains the newcomer's results in
        its write set; where dead results are reused, the newcomer's gains the results it may
        write over (not allocated at its capture), and its own results go out disowned."""
        if self.reuses:
            # Taken while the newcomer's results own their memory: allocated in the state.
            self._state = checkpoint_state(self.device, self._handle)
            for r in self.results:
                r.in_checkpoint = r.holds
            for p in self._placeholders:
                p.in_checkpoint, p.tensor = True, None
            self._placeholders = []
            newcomer.disown()
            newcomer.clobbers = [r for r in self.results if isinstance(r, Result) and not r.allocated
                                 and overlaps(newcomer.writes, r.start, r.end)]
        fresh = [Result(newcomer, k, s) for k, s in enumerate(newcomer.storages)]
        for member in list(self.members):
            if member is newcomer:
                continue
            member.clobbers = [c for c in member.clobbers if not c.gone()]
            member.clobbers.extend(r for r in fresh if overlaps(member.writes, r.start, r.end))
        self.results.extend(fresh)
        self.members.add(newcomer)

    def leave(self, program: Any) -> None:
        """``program``'s graph is freed; with no graph left in it and no result alive, the pool
        is released."""
        self.members.discard(program)
        self.release_if_idle()

    def release_if_idle(self) -> None:
        """The pool released where no program holds a graph in it and no result it handed out
        lives (the memory of those that did goes back to the pool first)."""
        if self.members or any(r.alive() for r in self.results):
            return
        for p in self._placeholders:
            p.tensor = None
        self._placeholders = []
        for r in self.results:
            if r.holds:
                give_back(r.start)
        self.results = []
        self._state = None
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
# Captures under way (``capturing``): a pool is not released between a capture and its ``admit``.
_captures_under_way = [0]


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Around a program's capture, from its pool's first use to its ``admit`` or its failure."""
    _captures_under_way[0] += 1
    try:
        yield
    finally:
        _captures_under_way[0] -= 1


def _release_after_collection(phase: str, info: dict) -> None:
    """After each garbage collection: pools with no graph left released once no result of them
    lives. A model freed in a reference cycle (a module and its hooks) leaves its pool in its
    programs' ``__del__``, while the cycle's other objects still hold the results; they are gone
    by the collection's end, and ``torch.cuda.empty_cache`` can then give the memory back."""
    if phase != "stop" or _captures_under_way[0]:
        return
    for pool in list(_pools.values()):
        if not pool.members and pool.results:
            pool.release_if_idle()


gc.callbacks.append(_release_after_collection)


def pools() -> list[SharedPool]:
    """Every device's shared pool made so far."""
    return list(_pools.values())


def for_device(device: torch.device) -> SharedPool:
    """The shared pool of ``device`` ("cuda" without an index: the current device's)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device.type, device.index)
    if key not in _pools:
        _pools[key] = SharedPool(device)
    return _pools[key]


def clobbered(clobbers: Sequence[Result]) -> bool:
    """Whether a result named in ``clobbers`` (another graph's, in this graph's write set) is
    alive: this graph's replay would overwrite it."""
    for r in clobbers:
        if r.alive():
            return True
    return False


def meets(a: Result | Placeholder, b: Result | Placeholder) -> bool:
    """Whether two results' (or blocks') memory overlaps."""
    return a.start < b.end and b.start < a.end


def _covered(r: Result | Placeholder, blocks: Sequence[Result | Placeholder]) -> bool:
    """Whether ``blocks`` together cover ``r``'s memory."""
    at = r.start
    for b in sorted(blocks, key=lambda b: b.start):
        if b.start <= at < b.end:
            at = b.end
    return at >= r.end


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
