"""Copies between a device and the host arena, ordered by events, never by the host.

The CUDA caching allocator hands memory out in host order, and the host runs far ahead
of the device. So every reuse of device memory here is ordered by a stream wait on the
stream that owns it, and memory is freed on the host as soon as that wait is queued:

- ``copy_out`` queues device-to-host copies on a copy stream after a fence on the
  producer. The caller keeps the sources alive until ``settle(done)`` has made the
  compute stream wait for the copies; then it drops them and the allocator may reuse
  the memory at once for later compute work.
- ``copy_in`` allocates the destinations from the compute stream's pool, makes the
  second (host-to-device) stream wait for the compute stream, then copies. Consumers
  wait on the returned event (``consume``); ``guard`` does that wait for buffers that
  are dropped without being consumed, so their memory is never reused under a copy.

On a CPU device the same calls copy synchronously into a separate host buffer, so the
scheduling above them runs, and is tested, unchanged. Every source and destination is
a flat uint8 tensor over a whole storage.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fuseops.offload.arena import HostArena, HostBlock, host_arena
from fuseops.offload.streams import CopyStream, current_stream


class HostLink:
    """A CPU device: synchronous copies, no streams, no events."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.arena: HostArena = host_arena(device)

    def fence(self) -> Any:
        return None

    def copy_out(self, sources: Sequence[torch.Tensor], after: Any) -> tuple[list[HostBlock], Any]:
        take = self.arena.take
        blocks = [take(src.numel()) for src in sources]
        for src, block in zip(sources, blocks):
            block.head(src.numel()).copy_(src)
        return blocks, None

    def settle(self, done: Any) -> None:
        pass

    def passed(self, done: Any) -> bool:
        """Whether the copies of ``done`` have finished (here: as they were issued)."""
        return True

    def copy_in(
        self, blocks: Sequence[HostBlock], sizes: Sequence[int], after: Sequence[Any]
    ) -> tuple[list[torch.Tensor], Any, Callable[[], None] | None]:
        outs = []
        for block, n in zip(blocks, sizes):
            outs.append(block.head(n).clone())
            self.arena.give(block)
        return outs, None, None

    def consume(self, data: torch.Tensor, event: Any) -> None:
        pass


class CudaLink:
    """One CUDA device: a device-to-host stream and a host-to-device stream."""

    # Fences kept for reuse at most (one per group in flight is used at a time).
    MAX_FENCES = 64
    # Block fences remembered as waited on (a step's reloads: one per group, or a few).
    MAX_BLOCK_FENCES = 16

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.arena: HostArena = host_arena(device)
        self.d2h = torch.cuda.Stream(device)
        self.h2d = torch.cuda.Stream(device)
        # ``consume`` runs at every unpack of a reloaded tensor; a reload's records share
        # one event, and reload buffers are allocated on one stream in a training step:
        # the last (event, stream) waited, and the stream every reload buffer so far was
        # allocated on (``_mixed`` once a second one was seen).
        self._last_wait: tuple[torch.cuda.Event, torch.cuda.Stream] | None = None
        self._allocated_on: torch.cuda.Stream | None = None
        self._mixed = False
        # ``copy_in`` orders its stream after compute with this one event, recorded anew
        # each time (a stream wait takes the event's state as it is queued, so a later
        # record cannot move it): ``wait_stream`` would create and destroy an event per call.
        # Reloads can come from more than one thread (the autograd engine's): the record
        # and the wait are one step.
        self._compute_done = torch.cuda.Event()
        self._order_lock = threading.Lock()
        # Fences ``copy_out`` has waited on, recorded again by later ``fence`` calls.
        self._fences: list[torch.cuda.Event] = []
        # Host blocks' fences (a reload's end mark) the copy-out stream has waited on. A
        # reload's blocks come back with one fence and are taken again one copy out after
        # another (one per storage, where groups move as they save); a stream that waited
        # on an event is ordered after it for good, and a copy's end mark is never
        # recorded again, so each is waited on once. By ``id``, oldest first, and held
        # (a few): an event known by its address must not be freed meanwhile.
        self._block_fences: dict[int, torch.cuda.Event] = {}

    def fence(self) -> torch.cuda.Event:
        """An event on the current (producer) stream: everything queued so far. Meant for
        one ``copy_out``, which takes it back once its stream waits on it."""
        # Popped from any thread: ``pop`` is atomic.
        try:
            event = self._fences.pop()
        except IndexError:
            event = torch.cuda.Event()
        event.record(current_stream(self.device))
        return event

    def copy_out(
        self, sources: Sequence[torch.Tensor], after: torch.cuda.Event
    ) -> tuple[list[HostBlock], torch.cuda.Event]:
        stream = self.d2h
        stream.wait_event(after)
        # The wait holds the fence's state as queued: the event may be recorded again.
        if len(self._fences) < self.MAX_FENCES:
            self._fences.append(after)
        take = self.arena.take
        blocks = [take(src.numel()) for src in sources]
        # A block's previous contents may still be on their way to a device. Blocks come
        # back in batches that share one fence (a reload's): each fence is waited on once.
        waited = self._block_fences
        for block in blocks:
            fence = block.fence
            if fence is not None and id(fence) not in waited:
                stream.wait_event(fence)
                waited[id(fence)] = fence
                if len(waited) > self.MAX_BLOCK_FENCES:
                    del waited[next(iter(waited))]
        with CopyStream(stream, self.device):
            for src, block in zip(sources, blocks):
                block.head(src.numel()).copy_(src, non_blocking=True)
        done = self._done(stream)
        return blocks, done

    def _done(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        """A new event after the copies just queued on ``stream`` (never recorded again:
        records, host blocks and the compute stream wait on it)."""
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def settle(self, done: torch.cuda.Event) -> None:
        """Order the current stream after the copies of ``done``: their sources may go."""
        current_stream(self.device).wait_event(done)

    def passed(self, done: torch.cuda.Event) -> bool:
        """Whether the copies of ``done`` have finished; never waits."""
        return done.query()

    def copy_in(
        self, blocks: Sequence[HostBlock], sizes: Sequence[int], after: Sequence[torch.cuda.Event]
    ) -> tuple[list[torch.Tensor], torch.cuda.Event, Callable[[], None]]:
        compute = current_stream(self.device)
        # The destinations come from the compute stream's pool: their last users there
        # must be done before the copy writes them.
        outs = [torch.empty(n, dtype=torch.uint8, device=self.device) for n in sizes]
        if self._allocated_on is None:
            self._allocated_on = compute
        elif not self._mixed and compute != self._allocated_on:
            self._mixed = True
        stream = self.h2d
        with self._order_lock:
            self._compute_done.record(compute)
            stream.wait_event(self._compute_done)
        for event in {id(e): e for e in after}.values():
            stream.wait_event(event)
        with CopyStream(stream, self.device):
            for out, block, n in zip(outs, blocks, sizes):
                out.copy_(block.head(n), non_blocking=True)
        done = self._done(stream)
        for block in blocks:
            self.arena.give(block, done)
        return outs, done, functools.partial(compute.wait_event, done)

    def consume(self, data: torch.Tensor, event: torch.cuda.Event) -> None:
        """Order the current stream after ``event``; keep ``data`` for its work if it is
        not the stream ``data`` was allocated on."""
        stream = current_stream(self.device)
        # Once a stream waited on an event (never recorded again: a copy's end mark is a
        # new event), all it runs later is ordered after it. Streams
        # come from one cache: identity answers first.
        last = self._last_wait
        if last is None or last[0] is not event or (last[1] is not stream and last[1] != stream):
            stream.wait_event(event)
            self._last_wait = (event, stream)
        # On the stream it was allocated on, record_stream is a no-op in the allocator.
        if self._mixed or (stream is not self._allocated_on and stream != self._allocated_on):
            data.record_stream(stream)


# An empty tensor per device and dtype: ``new_empty`` from it skips parsing the dtype
# and device arguments of ``torch.empty``, once per storage moved and per tensor unpacked.
_empties: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def empty_tensor(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``torch.empty(0, dtype=dtype, device=device)``: a tensor to ``set_`` a storage into."""
    empty = _empties.get((device, dtype))
    if empty is None:
        empty = _empties[(device, dtype)] = torch.empty(0, dtype=dtype, device=device)
    return empty.new_empty(0)


def whole_storage(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """A flat uint8 tensor over all of ``storage`` (on ``device``): a copy's source."""
    return empty_tensor(device, torch.uint8).set_(storage)


_links: dict[torch.device, HostLink | CudaLink] = {}


def link_for(device: torch.device) -> HostLink | CudaLink:
    """The link of ``device`` (streams are created on first use and kept)."""
    # Called per saved tensor: the lookup first, the normalisation only when it misses.
    link = _links.get(device)
    if link is not None:
        return link
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _links:
        _links[device] = CudaLink(device) if device.type == "cuda" else HostLink(device)
    return _links[device]
