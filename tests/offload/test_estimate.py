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
