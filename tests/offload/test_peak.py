"""Bytes resident on the device over a step, counted on CPU: what moves comes off the peak.

Resident bytes are the saved activation storages alive (every storage that reaches
``pack``, but parameters and the leaf input, and every buffer a reload makes),
sampled before and after each module in forward and before each module's backward.
The same model without offloading (an identity hook counting the same storages) is
the reference.
"""

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fuseops.offload import offload_activations
from fuseops.offload.link import HostLink
from fuseops.offload.scheduler import Scheduler
from tests.offload._models import mlp_layers
from tests.offload.test_api import saved_storages_by_group


class Resident:
    # The instance of the step now running: a node's backward samples its transients.
    current = None

    def __init__(self):
        self.storages, self.samples = {}, []
        Resident.current = self

    def add(self, t):
        base = t if t._base is None else t._base
        if not isinstance(base, torch.nn.Parameter) and not (base.is_leaf and base.requires_grad):
            storage = t.untyped_storage()
            self.storages[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
        return t

    def sample(self, *_, transient=0):
        self.samples.append(transient + sum(n for ref, n in self.storages.values() if not ref.expired()))


def step(layers, x, monkeypatch, offload):
    """Samples of one step, the offload stats (or None) and the sample at forward's end."""
    resident = Resident()
    hooks = []
    for module in layers.modules():
        if not list(module.children()):
            hooks.append(module.register_forward_pre_hook(resident.sample))
            hooks.append(module.register_forward_hook(resident.sample))
            hooks.append(module.register_full_backward_pre_hook(resident.sample))
    if offload is None:
        scope = torch.autograd.graph.saved_tensors_hooks(resident.add, lambda t: t)
    else:
        pack, copy_in = Scheduler.pack, HostLink.copy_in
        monkeypatch.setattr(Scheduler, "pack", lambda self, t: pack(self, resident.add(t)))

        def counted_copy_in(self, blocks, sizes, after):
            outs, done, guard = copy_in(self, blocks, sizes, after)
            for out in outs:
                resident.add(out)
            return outs, done, guard

        monkeypatch.setattr(HostLink, "copy_in", counted_copy_in)
        scope = offload_activations(min_tensor_bytes=1024, **offload)
    xr = x.clone().requires_grad_()
    with scope as handle:
        h = xr
        for layer in layers:
            with handle.group() if offload is not None else torch.enable_grad():
                h = h + layer(h)
    resident.sample()
    forward_end = resident.samples[-1]
    h.square().mean().backward()
    monkeypatch.undo()
    for hook in hooks:
        hook.remove()
    return resident.samples, handle.stats if offload is not None else None, forward_end


@pytest.mark.parametrize(
    "offload",
    [dict(group_budget_bytes=None), dict(group_budget_bytes=None, keep_last=0),
     dict(group_budget_bytes=None, keep_last=2), dict(group_budget_bytes=40_000)],
    ids=["all", "all-keep0", "all-keep2", "budget"],
)
def test_what_moves_comes_off_the_peak(monkeypatch, offload):
    layers, x = mlp_layers(n=6, width=64, hidden=256), torch.randn(128, 64)
    plain, _, plain_end = step(layers, x, monkeypatch, None)
    samples, stats, end = step(layers, x, monkeypatch, offload)
    moved = stats["bytes_offloaded"]
    assert moved > 0
    # When the forward ends, exactly what moved is off the device: no group in flight
    # once its copies have passed, nothing held by the scheduler.
    assert end == plain_end - moved
    # Over the whole step, the peak falls by all that moved, less at most half a group:
    # a prefetch lands once the group whose backward runs has consumed half its bytes.
    # With keep_last=0 the last group moves too, and comes straight back: backward
    # starts with it.
    groups = saved_storages_by_group(layers, x)
    back_at_once = sum(n for n in groups[-1] if n >= 1024) if offload.get("keep_last") == 0 else 0
    assert max(samples) <= max(plain) - (moved - back_at_once) + max(map(sum, groups)) // 2


class Spike(torch.autograd.Function):
    """``u * 2``, saving ``u``; its backward holds gradients as large as ``u`` four times
    over while it runs: the step's peak is inside it, as inside a fused grouped MLP."""

    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return u * 2

    @staticmethod
    def backward(ctx, dv):
        (u,) = ctx.saved_tensors
        Resident.current.sample(transient=4 * u.untyped_storage().nbytes())
        return dv * 2


class SpikyLayer(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(width, hidden), torch.nn.Linear(hidden, width)

    def forward(self, h):
        return self.fc2(Spike.apply(self.fc1(h)).relu())


@pytest.mark.parametrize("budget", [5120, None], ids=["partial", "all"])
def test_the_first_backward_prefetches_after_its_peak(monkeypatch, budget):
    # Each layer saves its input (5 kB), fc1's output (15 kB, inside Spike) and relu's
    # output (15 kB). The prefetch of the group before the last one must not land before
    # the last group's Spike backward, the step's peak, though fc2's backward has already
    # consumed more bytes than come back: without offloading those are freed all the same.
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(SpikyLayer(32, 96) for _ in range(5))
    x = torch.randn(40, 32)
    plain, _, _ = step(layers, x, monkeypatch, None)
    samples, stats, _ = step(layers, x, monkeypatch, dict(group_budget_bytes=budget))
    assert stats["bytes_offloaded"] > 0
    assert max(samples) <= max(plain) - stats["bytes_offloaded"]
