"""The CUDA calls a copy costs, checked on CPU with stand-in events and streams: the
copy-out stream waits once on each host block's fence."""

import contextlib

import pytest
import torch

from fuseops.offload import link as link_module
from fuseops.offload.arena import HostArena
from fuseops.offload.link import CudaLink
from tests.offload.test_cuda_calls import install_events

CPU = torch.device("cpu")


@pytest.fixture
def events(monkeypatch):
    return install_events(monkeypatch)


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
    link._fences, link._block_fences = [], {}
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
