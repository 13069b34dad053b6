"""The stated rates and the FLOPs a group's modules count (estimate.py)."""

import pytest
import torch
from torch import nn

import fuseops
from fuseops import ops
from fuseops.offload.estimate import FLOPS_PER_SAVED_BYTE, LINK_BYTES_PER_S, LINK_MARGIN, Rates, module_flops, rates_for


def test_a_linear_counts_two_flops_per_multiply_add_of_each_row():
    assert module_flops(nn.Linear(64, 32), (torch.randn(4, 10, 64),)) == 2 * 40 * 64 * 32


def test_a_sequential_counts_its_linear_and_grouped_linear_ops():
    seq = fuseops.Sequential(ops.LayerNorm(16), ops.Linear(16, 48), ops.GELU(), ops.Linear(48, 16))
    assert module_flops(seq, (torch.randn(7, 16),)) == 2 * 7 * (16 * 48 + 48 * 16)
    # Each row goes through one expert's weight.
    grouped = fuseops.Sequential(ops.GroupedLinear(4, 16, 64), ops.SwiGLU(), ops.GroupedLinear(4, 32, 16))
    assert module_flops(grouped, (torch.randn(9, 16), [9, 0, 0, 0], [9, 0, 0, 0])) == 2 * 9 * (16 * 64 + 32 * 16)


@pytest.mark.parametrize("module", [nn.LayerNorm(16), nn.GELU(), nn.Sequential(nn.Linear(16, 16))])
def test_modules_whose_flops_are_not_known_count_none(module):
    # nn.Sequential's Linear is called as a module: its own hook counts it.
    assert module_flops(module, (torch.randn(3, 16),)) == 0


def test_hidden_bytes_count_flops_or_where_none_are_known_the_saved_bytes_rule():
    rates = Rates(link_bytes_per_s=1e9, flops_per_s=1e12)
    assert rates.hidden_bytes(10**12, 10**9) == int(1e9 * LINK_MARGIN)
    assert rates.hidden_bytes(0, 10**9) == int(FLOPS_PER_SAVED_BYTE * 1e9 / 1e12 * 1e9 * LINK_MARGIN)


def test_the_cpu_rates_are_stated_and_the_link_overridable():
    assert rates_for(torch.device("cpu")).link_bytes_per_s == LINK_BYTES_PER_S["cpu"]
    assert rates_for(torch.device("cpu"), 3e9).link_bytes_per_s == 3e9


def test_a_block_that_hands_its_experts_to_expert_layer_counts_them_once_per_row():
    from benchmarks.offload import ExpertBlock
    from fuseops.offload import offload_activations

    torch.manual_seed(0)
    blocks = nn.ModuleList(ExpertBlock(64) for _ in range(2))
    x = torch.randn(512, 64)
    with offload_activations(min_tensor_bytes=0) as offload:
        h = x
        for b in blocks:
            with offload.group():
                h = b(h)
    h.sum().backward()
    group = offload._scope.plan.groups[0]
    ffn = 64 * 11 // 16
    assert group.flops == 2 * 512 * 64 * 8  # the router, called
    assert list(group.held_flops.values()) == [2 * 512 * (64 * 2 * ffn + ffn * 64)]


def test_a_held_sequential_the_step_calls_counts_once():
    from fuseops.offload import offload_activations
    from tests.offload.test_moe import moe_stack

    # The test MoE layer calls its experts itself: counted as called, not as held.
    layers, x = moe_stack(2, 64, 48, 4, 2, dtype=torch.float32), torch.randn(64, 64)
    with offload_activations(min_tensor_bytes=0) as offload:
        h = x
        for layer in layers:
            with offload.group():
                h = layer(h)
    h.sum().backward()
    plan = offload._scope.plan
    assert all(set(g.held_flops) <= plan._called for g in plan.groups)
