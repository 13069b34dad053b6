"""``fuseops::run_time_check`` (kernels/run_time_check.py): the operator a compiled graph runs to make
eager's check of a tensor's values, and the door eager calls go through."""

from __future__ import annotations

import pytest
import torch

import fuseops  # noqa: F401  (registers the checks)
from fuseops.kernels import run_time_check as rtc


def test_the_operator_passes_opcheck():
    op = torch.ops.fuseops.run_time_check.default
    torch.library.opcheck(op, ("split_sizes", torch.tensor([3, 0, 5]), 8, "split_sizes", ""))
    torch.library.opcheck(op, ("routing_range", torch.tensor([[0, 3], [2, 1]]), 4, "expert_ids", "num_experts=4"))


@pytest.mark.parametrize("check, t, bound, pattern", [
    ("split_sizes", torch.tensor([3, 0, 4]), 8, r"split_sizes: expected sizes summing to the 8 input rows, "
                                                 r"got \[3, 0, 4\] \(sum 7\)"),
    ("routing_range", torch.tensor([[0, 4]]), 4, r"expert_ids: expected values in \[0, 4\) \(num_experts=4\), "
                                                 r"got values in \[0, 4\]"),
])
def test_eager_calls_and_the_operator_raise_the_same_error(check, t, bound, pattern):
    name = "split_sizes" if check == "split_sizes" else "expert_ids"
    with pytest.raises(ValueError, match=pattern):
        rtc.run_time_check(check, t, bound, name, "num_experts=4")
    with pytest.raises(ValueError, match=pattern):
        torch.ops.fuseops.run_time_check.default(check, t, bound, name, "num_experts=4")
