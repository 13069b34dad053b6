"""The host's share of offloading: a group that can move nothing takes no per-tensor
bookkeeping (no records, no rebuilt views), yet counts what it skipped exactly as the
record path does and still marks its backward."""

import pytest
import torch

from fuseops.offload import offload_activations
from fuseops.offload import records as records_module
from fuseops.offload import scheduler as scheduler_module
from tests.offload._models import assert_bitwise, mlp_layers, run_step


@pytest.fixture
def stored_count(monkeypatch):
    """How many per-storage records the scheduler creates."""
    made = []

    class Counted(records_module.Stored):
        __slots__ = ()

        def __init__(self, *args):
            made.append(1)
            super().__init__(*args)

    monkeypatch.setattr(scheduler_module, "Stored", Counted)
    return made


def counts(stats):
    return {k: v for k, v in stats.items() if k.startswith(("tensors_", "skipped_", "bytes_"))}


@pytest.mark.parametrize("keep_last", [0, 1, 2])
@pytest.mark.parametrize("budget", [0, 1023])
def test_a_budget_under_the_smallest_storage_keeps_no_records(stored_count, monkeypatch, keep_last, budget):
    layers, x = mlp_layers(n=4), torch.randn(40, 32)
    config = dict(min_tensor_bytes=1024, keep_last=keep_last)
    step = run_step(layers, x, dict(config, group_budget_bytes=budget))
    assert stored_count == []
    assert_bitwise(step, run_step(layers, x))
    # The record path (a budget of 1024 B moves nothing here either: every storage the
    # layers save is larger; records forced, no cap) counts the same skips, kept groups included.
    monkeypatch.setattr(scheduler_module.Scheduler, "_cap", lambda self, group: None)
    recorded = run_step(layers, x, dict(config, group_budget_bytes=1024)).offload.stats
    assert stored_count != []
    assert recorded["bytes_offloaded"] == 0 and recorded["skipped_budget"] > 0
    assert counts(step.offload.stats) == counts(recorded)


def _saved_then_changed(options):
    x = torch.randn(64, 64, requires_grad=True, generator=torch.Generator().manual_seed(0))
    with offload_activations(min_tensor_bytes=1024, **options) as handle:
        for _ in range(2):
            with handle.group():
                h = x * 1
                y = h.sin()
    h.add_(1)
    return y


@pytest.mark.parametrize("options", [dict(group_budget_bytes=0), dict(group_budget_bytes=0, keep_last=0)],
                         ids=["budget0", "budget0-keep0"])
def test_a_passed_tensor_changed_in_place_raises_like_autograd(stored_count, options):
    # Saved-tensor hooks switch autograd's own version check off: the pass-through path
    # (no records: a budget under min_tensor_bytes) must make it, or backward would read
    # the changed values and return a wrong gradient.
    y = _saved_then_changed(options)
    assert stored_count == []
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def _records_forced(monkeypatch):
    """The record path for every storage (no cap): what the pass-through must match."""
    monkeypatch.setattr(scheduler_module.Scheduler, "_cap", lambda self, group: None)


@pytest.mark.parametrize("keep_last", [0, 1, 2])
def test_storages_over_an_int_budget_keep_no_records_and_move_the_same(stored_count, monkeypatch, keep_last):
    # Per layer: input and norm output 5120 B, the GELU's input and output 15360 B. A
    # budget of 12000 B can move the small ones only: the large ones pass through.
    layers, x = mlp_layers(n=4), torch.randn(40, 32)
    config = dict(min_tensor_bytes=1024, keep_last=keep_last, group_budget_bytes=12000)
    _passing_moves_what_records_move(layers, x, config, stored_count, monkeypatch)


def _passing_moves_what_records_move(layers, x, config, stored_count, monkeypatch) -> None:
    """A step whose over-cap storages pass through: bitwise the step without offload, fewer
    records than with every storage recorded, and the same moves and skips as that step."""
    step = run_step(layers, x, config)
    passed_records = len(stored_count)
    assert_bitwise(step, run_step(layers, x))
    stored_count.clear()
    _records_forced(monkeypatch)
    recorded = run_step(layers, x, config)
    assert 0 < passed_records < len(stored_count)
    assert step.offload.stats["bytes_offloaded"] > 0
    assert counts(step.offload.stats) == counts(recorded.offload.stats)
