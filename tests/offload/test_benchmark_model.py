"""The benchmark's transformer layer and step, small, on CPU: every scheme is bitwise."""

import pytest
import torch

from benchmarks.offload import Layer, step
from fuseops.offload import link_budget, mark_not_offload


@pytest.mark.parametrize("name", ["fuseops", "fuseops_all", "save_on_cpu"])
def test_every_scheme_of_the_benchmark_is_bitwise(name):
    torch.manual_seed(0)
    # Large enough for the default floor of 256 KiB: 1 MiB per [tokens, hidden] float32.
    layers = torch.nn.ModuleList(Layer(128, head_dim=32) for _ in range(3))
    x = torch.randn(2, 1024, 128)
    mark_not_offload(x)

    def grads(scheme, budget=None):
        stats = step(layers, x, scheme, budget)
        return [p.grad.clone() for p in layers.parameters()], stats

    want, _ = grads("none")
    budget = 3 * 2**20 if name == "fuseops" else None
    got, stats = grads(name, budget)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    if stats is not None:
        assert stats["bytes_offloaded"] == stats["bytes_reloaded"] > 0
        assert stats["skipped_marked"] == 1  # the input, saved by the first norm


def test_link_budget_arithmetic():
    # 6 ms of forward at 54 GB/s, planning for 90% of the link.
    assert link_budget(6e-3) == int(6e-3 * 54e9 * 0.9)
    assert link_budget(1e-3, bytes_per_s=10e9, margin=1.0) == 10_000_000
    # offload_activations' docstring: a 2 ms layer hides 108 MB, 97 MB planned.
    assert link_budget(2e-3, margin=1.0) == 108_000_000 and link_budget(2e-3) == 97_200_000
