"""The CUDA calls a copy costs, checked on CPU with stand-in events and streams: a copy's
start mark goes back to its timer once its meter has read or dropped it (the bandwidth
read is the same), and the copy-out stream waits once on each host block's fence."""

import contextlib

import pytest
import torch

from fuseops.offload import link as link_module
from fuseops.offload.arena import HostArena
from fuseops.offload.link import CudaLink
from fuseops.offload.timing import CopyMeter, EventTimer
from tests.offload.test_cuda_calls import StandInEvent, install_events

CPU = torch.device("cpu")


class TimedEvent(StandInEvent):
    """A stand-in event whose record ``n`` is at ``n`` ms."""

    def elapsed_time(self, end) -> float:
        return float(end.record_n - self.record_n)


@pytest.fixture
def events(monkeypatch):
    return install_events(monkeypatch, TimedEvent)


def _meter():
    timer = EventTimer(CPU)
    return CopyMeter(timer), timer


def test_start_marks_read_go_back_to_the_timer_and_the_bandwidth_is_unchanged(events, monkeypatch):
    meter, timer = _meter()
    stream = object()
    copies = [(timer.mark(stream), timer.mark(stream), n) for n in (1000, 3000, 5000)]
    for start, end, nbytes in copies:
        meter.record(start, end, nbytes)
    events.reached = 4  # the first two copies have passed, the third has not
    # 4000 bytes over 2 ms (each copy is 1 ms between its marks).
    assert meter.bytes_per_s() == 4000 / 2e-3
    assert timer._free == [copies[0][0], copies[1][0]]
    events.reached = 6
    assert meter.bytes_per_s() == 9000 / (1e-3 + 1e-3 + 1e-3)
    # No end mark is handed back: records, host blocks and streams wait on those.
    assert timer._free == [copies[0][0], copies[1][0], copies[2][0]]


def test_start_marks_dropped_unread_go_back_to_the_timer(events, monkeypatch):
    meter, timer = _meter()
    monkeypatch.setattr(CopyMeter, "MAX_PENDING", 2)
    stream = object()
    copies = [(timer.mark(stream), timer.mark(stream), 1000) for _ in range(3)]
    for start, end, nbytes in copies:
        meter.record(start, end, nbytes)
    assert timer._free == [copies[0][0]]
    # The next mark records that event again instead of creating one.
    assert timer.mark(stream) is copies[0][0]
    events.reached = 100
    assert meter.bytes_per_s() == 2000 / 2e-3


class WaitLog:
    """A stand-in stream that logs the events it is made to wait on."""

    def __init__(self) -> None:
        self.waits: list = []

    def wait_event(self, event) -> None:
        self.waits.append(event)


def test_copy_out_waits_once_on_each_block_fence(events, monkeypatch):
    monkeypatch.setattr(link_module, "CopyStream", lambda stream, device: contextlib.nullcontext())
    link = object.__new__(CudaLink)  # streams and events stood in: only copy_out runs
    link.device, link.d2h, link.arena = CPU, WaitLog(), HostArena(pinned=False)
    link.meter, link._fences, link._block_fences = CopyMeter(EventTimer(CPU)), [], {}
    reload_a, reload_b = events(), events()
    # Blocks given back by two reloads, each batch with its reload's end mark.
    blocks = [link.arena.take(4096) for _ in range(4)]
    for block, fence in zip(blocks, [reload_a, reload_a, reload_b, reload_b]):
        link.arena.give(block, fence)
    sources = [torch.full((4096,), i, dtype=torch.uint8) for i in range(4)]
    fences = [events() for _ in sources]
    taken = []
    for source, fence in zip(sources, fences):
        # One copy out per storage, as a group moving as it saves issues them.
        out, _ = link.copy_out([source], fence)
        taken += out
    waits = link.d2h.waits
    assert [w for w in waits if w in (reload_a, reload_b)] == [reload_b, reload_a]
    assert [w for w in waits if w in fences] == fences
    assert all(torch.equal(b.data, s) for b, s in zip(taken, sources))
