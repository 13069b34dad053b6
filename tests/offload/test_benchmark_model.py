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


def test_profile_counts_overlapping_kernels_once():
    from benchmarks.offload_profile import _union

    # Busy time is the union of kernel intervals: overlaps and nesting count once.
    assert _union([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.2, 5.5)]) == 4.0
    assert _union([]) == 0.0


def test_host_meter_counts_every_pack_and_restores_the_scheduler():
    import contextlib

    from benchmarks.offload import MLPLayer
    from benchmarks.offload_host import HostMeter, install
    from fuseops.offload import hooks, offload_activations
    from fuseops.offload.scheduler import Scheduler

    originals = dict(vars(Scheduler)), hooks._pre_hook, hooks._post_hook
    layers = torch.nn.ModuleList(MLPLayer(32) for _ in range(3))
    x = torch.randn(16, 32, requires_grad=True)
    meter = HostMeter()
    with contextlib.ExitStack() as patches:
        install(meter, patches, breakdown=True)
        with offload_activations(min_tensor_bytes=0, group_budget_bytes=None) as handle:
            h = x
            for layer in layers:
                with handle.group():
                    h = layer(h)
        h.sum().backward()
    stats = handle.stats
    # Every saved tensor reaches pack once and is counted as offloaded or skipped.
    assert meter.packs == stats["tensors_offloaded"] + stats["tensors_skipped"] > 0
    assert meter.seconds > 0
    assert meter.inner["Scheduler._offload"][1] == stats["groups"] - 1  # keep_last=1
    assert meter.inner["HostLink.copy_out"][1] > 0
    assert (dict(vars(Scheduler)), hooks._pre_hook, hooks._post_hook) == originals
