"""What stays on the device is decided without timings: the same from the first step and
in every process; a memory target holds from the first step or names the lowest peak it
can reach; the stats say where the step's peak fell (the CPU device's byte accounting)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fuseops.offload import offload_activations
from fuseops.offload.estimate import FLOPS_PER_SAVED_BYTE, LINK_MARGIN, rates_for
from tests.offload._models import assert_bitwise, fuseops_layers, mlp_layers, run_step

ROOT = Path(__file__).resolve().parents[2]


def per_step(layers, x, config, steps=3):
    """Per step: bytes moved, and the accounted peak with where it fell."""
    out = []
    for _ in range(steps):
        stats = run_step(layers, x, config).offload.stats
        out.append((stats["bytes_offloaded"], stats["peak_bytes"], stats["peak_where"]))
    return out


@pytest.mark.parametrize("make", [mlp_layers, fuseops_layers], ids=["torch", "fuseops"])
def test_the_default_moves_the_same_bytes_from_the_first_step(make):
    layers, x = make(n=4, width=64, hidden=256), torch.randn(256, 64)
    # A stated link slow enough that each group hides part of what it saves, not all.
    config = dict(group_budget_bytes="auto", min_tensor_bytes=0, link_bytes_per_s=1e8)
    steps = per_step(layers, x, config)
    everything = run_step(layers, x, dict(group_budget_bytes=None, min_tensor_bytes=0)).offload.stats
    assert steps[0] == steps[1] == steps[2]
    assert 0 < steps[0][0] < everything["bytes_offloaded"]
    assert_bitwise(run_step(layers, x, config), run_step(layers, x))


def test_a_group_moves_what_the_link_hides_behind_its_flops():
    # One Linear per group, 256 rows of 64 -> 256: 2 * 256 * 64 * 256 FLOPs each; the
    # group's storages (its input and output, 64 KiB each) fill the allowance whole.
    layers = nn.ModuleList(nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 64)) for _ in range(3))
    x = torch.randn(256, 64)
    rates = rates_for(torch.device("cpu"), 1e9)
    flops = 2 * 256 * 64 * 256 * 2
    hidden = int(flops / rates.flops_per_s * rates.link_bytes_per_s * LINK_MARGIN)
    stats = run_step(layers, x, dict(min_tensor_bytes=0, link_bytes_per_s=1e9, group_budget_bytes="auto"),
                     residual=False).offload.stats
    # Group 0 gets its own share; group 1 that and what group 0 left unused.
    assert stats["groups_planned"] == 2 and stats["planned_bytes"] >= 2 * hidden
    assert 0 < stats["bytes_offloaded"] <= stats["planned_bytes"]


def test_a_group_of_unknown_flops_counts_its_saved_bytes():
    x = torch.randn(256, 256, requires_grad=True)
    with offload_activations(min_tensor_bytes=0, link_bytes_per_s=1e9) as offload:
        for _ in range(2):
            with offload.group():
                # sin saves the leaf x (kept as a leaf), exp its output: 256 KiB that may move.
                x = x.sin().exp()
    x.sum().backward()
    rates = rates_for(torch.device("cpu"), 1e9)
    allowance = int(FLOPS_PER_SAVED_BYTE * 2**18 / rates.flops_per_s * rates.link_bytes_per_s * LINK_MARGIN)
    assert offload.stats["groups_planned"] == 1 and offload.stats["planned_bytes"] == allowance
    assert offload.stats["bytes_offloaded"] == (2**18 if allowance >= 2**18 else 0)


_TWO_PROCESSES = """
import json, torch
from tests.offload._models import fuseops_layers, run_step
layers, x = fuseops_layers(n=4, width=64, hidden=256), torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
rows = []
for config in (dict(link_bytes_per_s=1e8), dict(link_bytes_per_s=1.0, peak_bytes_target=TARGET)):
    for _ in range(3):
        s = run_step(layers, x, dict(config, group_budget_bytes="auto", min_tensor_bytes=0)).offload.stats
        rows.append([s["bytes_offloaded"], s["bytes_for_target"], s["peak_bytes"], s["peak_where"]])
print(json.dumps(rows))
"""


def test_two_processes_hold_the_same_bytes_at_every_step():
    layers, x = fuseops_layers(n=4, width=64, hidden=256), torch.randn(256, 64)
    kept = run_step(layers, x, dict(min_tensor_bytes=0, link_bytes_per_s=1.0, group_budget_bytes="auto"))
    kept = kept.offload.stats["peak_bytes"]
    moved = run_step(layers, x, dict(min_tensor_bytes=0, group_budget_bytes=None)).offload.stats["peak_bytes"]
    script = _TWO_PROCESSES.replace("TARGET", str((kept + moved) // 2))
    runs = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
            for _ in range(2)]
    first, second = (json.loads(r.stdout) for r in runs)
    assert first == second
    assert first[0] == first[1] == first[2] and first[3] == first[4] == first[5]
    assert first[0][0] > 0 and first[3][1] > 0


def test_a_target_holds_from_the_first_step_and_says_what_it_cost():
    layers, x = fuseops_layers(n=5, width=64, hidden=256), torch.randn(256, 64)
    slow = dict(min_tensor_bytes=0, link_bytes_per_s=1.0, group_budget_bytes="auto")
    kept = run_step(layers, x, slow).offload.stats
    moved = run_step(layers, x, dict(slow, group_budget_bytes=None)).offload.stats
    assert kept["bytes_offloaded"] == 0 and moved["peak_bytes"] < kept["peak_bytes"]
    target = (kept["peak_bytes"] + moved["peak_bytes"]) // 2
    steps = per_step(layers, x, dict(slow, peak_bytes_target=target))
    assert steps[0] == steps[1] == steps[2] and steps[0][1] <= target
    # It moved only what it must: less than everything.
    assert 0 < steps[0][0] < moved["bytes_offloaded"]
    step = run_step(layers, x, dict(slow, peak_bytes_target=target))
    assert step.offload.stats["bytes_for_target"] == step.offload.stats["bytes_offloaded"]
    assert_bitwise(step, run_step(layers, x))


@pytest.mark.parametrize("keep_last", [0, 1, 2])
def test_a_target_at_the_lowest_peak_holds_and_one_byte_under_it_raises(keep_last):
    layers, x = fuseops_layers(n=4, width=64, hidden=256), torch.randn(256, 64)
    config = dict(min_tensor_bytes=0, keep_last=keep_last, link_bytes_per_s=1.0, group_budget_bytes="auto")
    # A target's copies settle without the default's one group of spill: its account's own lowest.
    lowest = run_step(layers, x, dict(config, peak_bytes_target=2**40)).offload.stats["peak_lowest_bytes"]
    held = run_step(layers, x, dict(config, peak_bytes_target=lowest)).offload.stats
    assert held["peak_bytes"] == lowest
    with pytest.raises(ValueError, match=r"peak_bytes_target: \d+ bytes is below the lowest peak offloading can "
                                         r"reach in this step, (at least )?\d+ bytes .* expected a target >= \d+"):
        run_step(layers, x, dict(config, peak_bytes_target=lowest - 1))


def test_a_target_under_what_the_weights_need_raises_before_anything_is_saved():
    layers, x = fuseops_layers(n=2, width=64, hidden=256), torch.randn(8, 64)
    grads = sum(p.numel() * p.element_size() for p in layers[0].parameters())
    x = x.requires_grad_()
    with pytest.raises(ValueError, match=f"at least {grads} bytes"):
        with offload_activations(peak_bytes_target=grads - 1, min_tensor_bytes=0):
            layers[0](x)


def test_the_peak_report_says_when_offloading_cannot_lower_it():
    # Activations make the peak: the report names the first backward, and moving
    # everything would lower it.
    layers, x = fuseops_layers(n=4, width=64, hidden=256), torch.randn(512, 64)
    stats = run_step(layers, x, dict(min_tensor_bytes=0, link_bytes_per_s=1.0, group_budget_bytes="auto")).offload.stats
    assert stats["peak_where"] == "backward of group 3" and stats["peak_offload_can_lower"] > 0
    assert stats["peak_lowest_bytes"] == stats["peak_bytes"] - stats["peak_offload_can_lower"]
    # Wide weights and few tokens: the weight gradients make it; offloading lowers nothing.
    wide = nn.ModuleList([nn.Linear(64, 4096), nn.Linear(4096, 64)])
    stats = run_step(wide, torch.randn(4, 64), dict(min_tensor_bytes=0), residual=False).offload.stats
    assert stats["peak_where"] == "weight gradients" and stats["peak_offload_can_lower"] == 0
    assert stats["peak_bytes"] == sum(p.numel() * 4 for p in wide.parameters())


def test_a_checkpoint_recompute_in_the_backward_starts_no_new_step():
    layers, x = mlp_layers(n=3, width=64, hidden=256), torch.randn(256, 64, requires_grad=True)

    def run(inside: bool):
        for p in layers.parameters():
            p.grad = None
        with offload_activations(min_tensor_bytes=0, group_budget_bytes="auto") as offload:
            h = x
            for layer in layers:
                with offload.group():
                    h = h + torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=False)
            loss = h.square().mean()
            if inside:
                loss.backward()
        if not inside:
            loss.backward()
        return offload.stats

    after, inside = run(False), run(True)
    # The recompute's module calls count to no group: the account is the forward's.
    assert inside["peak_bytes"] == after["peak_bytes"] and inside["peak_where"] == after["peak_where"]
