"""Clocks the offload planner reads: marks in a device's work, read without waiting.

A timer's ``mark(stream)`` records a point in the work queued so far (a CUDA event on
the current stream, or a host time where the device is the CPU and runs in host order);
``seconds(start, end)`` is the time between two marks once both have passed, else
``None``: the host never waits on a mark. ``passed(mark)`` and ``elapsed(start, end)``
split that in two, so that a reader of many marks that share ends (one step's chain of
group starts) queries each mark once, and ``EventTimer.passed_all(marks)`` only the last
mark of each stream; ``reuse(marks)`` (``EventTimer`` only) takes back
marks that have passed and are read no more. ``CopyMeter`` turns a link's copy marks into a
measured bandwidth the same way. Tests stand in a deterministic timer with the same
methods.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Protocol

import torch

from fuseops.offload.streams import current_stream


class Timer(Protocol):
    def mark(self, stream: Any = None) -> Any:
        """A point after everything queued so far (on ``stream``, or the current one)."""

    def seconds(self, start: Any, end: Any) -> float | None:
        """Seconds from ``start`` to ``end``; ``None`` while either has not passed."""

    def passed(self, mark: Any) -> bool:
        """Whether the device has reached ``mark`` (never waits)."""

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds from ``start`` to ``end``, both passed."""


class HostTimer:
    """A CPU device runs its work in host order: the host's clock is the device's."""

    def mark(self, stream: Any = None) -> float:
        return time.perf_counter()

    def seconds(self, start: float, end: float) -> float | None:
        return end - start

    def passed(self, mark: float) -> bool:
        return True

    def elapsed(self, start: float, end: float) -> float:
        return end - start


class EventTimer:
    """CUDA events with timing, read with ``query()`` (which never blocks). Marks that
    their reader is done with come back through ``reuse`` and are recorded again: an
    event created and destroyed per mark costs the host two more CUDA calls."""

    # Events kept for reuse at most (a step's planner marks: a few per group).
    MAX_FREE = 256

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._free: list[torch.cuda.Event] = []

    def mark(self, stream: torch.cuda.Stream | None = None) -> torch.cuda.Event:
        # Marks come from the forward thread and the autograd engine's: ``pop`` is atomic.
        try:
            event = self._free.pop()
        except IndexError:
            event = torch.cuda.Event(enable_timing=True)
        if stream is None:
            stream = current_stream(self.device)
        event.record(stream)
        # Where and when it was recorded (``passed_all``); the stream object is held, so
        # no other stream can take its id while the mark lives.
        event.offload_order = (stream, next(_order))
        return event

    def passed_all(self, marks: list[torch.cuda.Event]) -> bool:
        """Whether every one of ``marks`` has passed: a stream runs its work in order, so
        only the last mark recorded on each stream is queried (the latest stream first:
        one query while the device is still behind)."""
        last: dict[int, tuple[int, torch.cuda.Event]] = {}
        others = []
        for mark in marks:
            order = getattr(mark, "offload_order", None)
            if order is None:
                others.append(mark)
                continue
            stream, n = order
            seen = last.get(id(stream))
            if seen is None or n > seen[0]:
                last[id(stream)] = (n, mark)
        latest = sorted(last.values(), key=lambda item: -item[0])
        return all(mark.query() for _, mark in latest) and all(mark.query() for mark in others)

    def reuse(self, marks: list[torch.cuda.Event]) -> None:
        """Nothing reads or waits on ``marks`` any more (the planner's have passed; a
        copy's start mark may not have, but only its meter ever read it): later ``mark``
        calls record them again (a record replaces the event's state)."""
        room = self.MAX_FREE - len(self._free)
        if room > 0:
            self._free.extend(marks[:room])

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float | None:
        # The later mark first: while it has not passed, one query answers.
        if not (end.query() and start.query()):
            return None
        return start.elapsed_time(end) / 1e3

    def passed(self, mark: torch.cuda.Event) -> bool:
        return mark.query()

    def elapsed(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1e3


# Marks of every ``EventTimer`` are numbered in the order they were recorded.
_order = itertools.count()


def timer_for(device: torch.device) -> HostTimer | EventTimer:
    return EventTimer(device) if device.type == "cuda" else HostTimer()


class CopyMeter:
    """The link's measured bandwidth: bytes over seconds of the copies whose marks have
    passed, summed over every copy seen (so long copies weigh by their bytes)."""

    # Copies waiting to be read; older ones are dropped unread past this (a run that
    # never lets the host see its events must not grow a list).
    MAX_PENDING = 256

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.bytes = 0
        self.seconds = 0.0
        self._pending: list[tuple[Any, Any, int]] = []
        # Copies are recorded from the forward thread and the autograd engine's threads.
        self._lock = threading.Lock()
        # A copy's start mark is read by this meter alone (its end mark orders records,
        # host blocks and the compute stream): once read, or dropped unread, it goes back
        # to the timer to be recorded again (``EventTimer.reuse``; nothing waits on it,
        # so a record over one not yet passed is harmless). Without this every copy
        # creates and destroys a CUDA event more, and the planner stops reading the
        # meter once its plan is made, so the dropped ones are most of them.
        self._reuse = getattr(timer, "reuse", None)

    def record(self, start: Any, end: Any, nbytes: int) -> None:
        with self._lock:
            pending = self._pending
            pending.append((start, end, nbytes))
            if len(pending) > self.MAX_PENDING:
                dropped = pending[: -self.MAX_PENDING]
                del pending[: -self.MAX_PENDING]
                if self._reuse is not None:
                    self._reuse([s for s, _, _ in dropped])

    def bytes_per_s(self) -> float | None:
        """Measured so far, reading only copies that have finished; ``None`` before any."""
        with self._lock:
            waiting, read = [], []
            for start, end, nbytes in self._pending:
                seconds = self.timer.seconds(start, end)
                if seconds is None:
                    waiting.append((start, end, nbytes))
                    continue
                read.append(start)
                if seconds > 0:
                    self.bytes += nbytes
                    self.seconds += seconds
            self._pending = waiting
            if read and self._reuse is not None:
                self._reuse(read)
            return self.bytes / self.seconds if self.seconds > 0 else None
