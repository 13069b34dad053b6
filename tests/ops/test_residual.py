import pytest
import torch

import fuseops
from fuseops import ops
from tests.helpers import DTYPES
from tests.ops.harness import check_op_against_float64, devices


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_extra_input(device, dtype):
    r = torch.randn(3, 4, 6, dtype=dtype)
    check_op_against_float64(ops.AddExtraInput(), lambda x, p, r: x + r, (3, 4, 6), dtype, device, [r])


def test_make_extra_output_returns_the_branch_and_sums_its_gradient():
    model = fuseops.Sequential(ops.MakeExtraOutput(), ops.Linear(4, 4, bias=False), ops.AddExtraInput())
    x = torch.randn(2, 4, requires_grad=True)
    y, branch = model(x, torch.zeros(2, 4))
    torch.testing.assert_close(branch, x)
    (y.sum() + 2 * branch.sum()).backward()
    w = model[1].weight
    torch.testing.assert_close(x.grad, torch.ones(2, 4) @ w + 2)


def test_residual_shape_mismatch():
    with pytest.raises(ValueError, match=r"extra input r: expected shape \[2, 4\], got \[2, 5\]"):
        fuseops.Sequential(ops.AddExtraInput())(torch.randn(2, 4), torch.randn(2, 5))
