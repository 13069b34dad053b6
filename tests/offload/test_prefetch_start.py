"""When the link is behind compute (the host has not seen the forward's copies pass, as on
a GPU running behind the host), the forward holds the sources of the copies in flight:
later groups' prefetches may fill back up to that forward peak, so each starts with its
group's backward instead of leaving the link idle until half the group is consumed."""

import pytest
import torch

from fuseops.offload.link import HostLink
from fuseops.offload.scheduler import Scheduler
from tests.offload._models import assert_bitwise, mlp_layers, run_step
from tests.offload.test_peak import step as resident_step

EVERYTHING = dict(min_tensor_bytes=1024, group_budget_bytes=None)


@pytest.fixture
def link_behind(monkeypatch):
    """The host never sees a copy out pass: sources wait for their settle point."""
    monkeypatch.setattr(HostLink, "passed", lambda link, done: False)


def backward_events(monkeypatch, layers, x, link=HostLink, options=EVERYTHING):
    """The step with everything offloaded, and its backward's unpacks and reloads in order."""
    events = []
    unpack, copy_in = Scheduler.unpack, link.copy_in

    def logged_unpack(self, packed):
        if hasattr(packed, "stored"):
            events.append(("unpack", packed.group))
        return unpack(self, packed)

    def logged_copy_in(self, blocks, sizes, after):
        if blocks:
            events.append(("reload", len(blocks)))
        return copy_in(self, blocks, sizes, after)

    monkeypatch.setattr(Scheduler, "unpack", logged_unpack)
    monkeypatch.setattr(link, "copy_in", logged_copy_in)
    step = run_step(layers, x, options)
    if x.is_cuda:
        torch.cuda.synchronize()
    monkeypatch.undo()
    return step, events


def test_later_groups_prefetch_as_their_backward_starts(monkeypatch, link_behind):
    layers, x = mlp_layers(n=4), torch.randn(40, 32)
    want = run_step(layers, x)
    step, events = backward_events(monkeypatch, layers, x)
    assert_bitwise(step, want)
    # Group 3 stays and is first to run its backward (its prefetch of group 2 waits past
    # its peak); groups 2 and 1 bring back the group before them at their first unpack.
    for group in (2, 1):
        first = events.index(("unpack", group))
        assert events[first + 1][0] == "reload", events


def test_the_backward_holds_no_more_saved_bytes_than_the_forward_did(monkeypatch, link_behind):
    layers, x = mlp_layers(n=6, width=64, hidden=256), torch.randn(128, 64)
    samples, stats, end = resident_step(layers, x, monkeypatch, dict(group_budget_bytes=None))
    assert stats["bytes_offloaded"] > 0
    forward = samples[: samples.index(end) + 1]
    assert max(samples) == max(forward)


@pytest.mark.gpu
def test_on_the_gpu_later_groups_prefetch_as_their_backward_starts(monkeypatch):
    # Large enough that the copies out run behind the host (256 MB each at ~55 GB/s).
    from fuseops.offload.link import CudaLink

    layers = mlp_layers(n=4, width=4096, hidden=16384, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
    want = run_step(layers, x)
    step, events = backward_events(monkeypatch, layers, x, CudaLink, dict(group_budget_bytes=None))
    assert_bitwise(step, want)
    for group in (2, 1):
        first = events.index(("unpack", group))
        assert events[first + 1][0] == "reload", events
