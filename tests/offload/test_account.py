"""The step's account against every storage alive on a CPU device: counted by a dispatch
mode over every op of the step (the parameters, the input and gradients allocated before
it are the account's ``base``, which a CPU device counts as 0), host blocks excepted. The
account's peak covers the real one, without offloading and under a memory target."""

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fuseops.offload import arena as arena_module
from fuseops.offload import offload_activations
from tests.offload._models import fuseops_layers


class Alive(TorchDispatchMode):
    """The bytes of the storages alive after each op, at their peak."""

    def __init__(self, excluded: set[int]) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}
        self.excluded, self.peak = excluded, 0
        # While the arena makes a host block: not sampled until the block is known.
        self.paused = False

    def add(self, t: torch.Tensor) -> None:
        s = t.untyped_storage()
        self.storages[s._cdata] = (StorageWeakRef(s), s.nbytes())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((out, args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                self.add(t)
        if not self.paused:
            alive = sum(n for key, (ref, n) in self.storages.items() if key not in self.excluded and not ref.expired())
            self.peak = max(self.peak, alive)
        return out


def real_and_accounted(layers, x, config, monkeypatch):
    """The step's real peak above what existed before it, and its accounted peak."""
    blocks: set[int] = set()
    take = arena_module.HostArena.take

    def recorded(self, nbytes):
        alive.paused = True
        block = take(self, nbytes)
        blocks.add(block.data.untyped_storage()._cdata)
        alive.paused = False
        return block

    monkeypatch.setattr(arena_module.HostArena, "take", recorded)
    before = {p.untyped_storage()._cdata for p in layers.parameters()} | {x.untyped_storage()._cdata}
    for p in layers.parameters():
        p.grad = None
    alive = Alive(blocks)
    blocks |= before
    with alive:
        with offload_activations(min_tensor_bytes=0, **config) as offload:
            h = x
            for layer in layers:
                h = layer(h)
        h.square().mean().backward()
    monkeypatch.undo()
    return alive.peak, offload.stats


@pytest.mark.parametrize("config", [dict(link_bytes_per_s=1.0), dict(group_budget_bytes=None)],
                         ids=["nothing-moves", "everything"])
def test_the_account_covers_every_storage_alive(config, monkeypatch):
    layers, x = fuseops_layers(n=4, width=64, hidden=256), torch.randn(512, 64)
    real, stats = real_and_accounted(layers, x, config, monkeypatch)
    assert real <= stats["peak_bytes"]


def test_a_target_holds_every_storage_alive_under_it(monkeypatch):
    layers, x = fuseops_layers(n=5, width=64, hidden=256), torch.randn(512, 64)
    _, kept = real_and_accounted(layers, x, dict(link_bytes_per_s=1.0), monkeypatch)
    _, moved = real_and_accounted(layers, x, dict(group_budget_bytes=None), monkeypatch)
    target = (kept["peak_bytes"] + moved["peak_bytes"]) // 2
    real, stats = real_and_accounted(layers, x, dict(link_bytes_per_s=1.0, peak_bytes_target=target), monkeypatch)
    assert stats["bytes_for_target"] > 0 and real <= stats["peak_bytes"] <= target
