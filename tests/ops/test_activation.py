import pytest
import torch
import torch.nn.functional as F

from fuseops import ops
from tests.helpers import DTYPES
from tests.ops.harness import check_op_against_float64, devices

CASES = [
    (ops.ReLU, {}, torch.relu),
    (ops.GELU, {}, F.gelu),
    (ops.GELU, {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh")),
    (ops.SiLU, {}, F.silu),
    (ops.SReLU, {}, lambda x: torch.relu(x).square()),
    (ops.Sigmoid, {}, torch.sigmoid),
]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls, kwargs, fn", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_activation_matches_float64(device, dtype, cls, kwargs, fn):
    check_op_against_float64(cls(**kwargs), lambda x, p: fn(x), (3, 5, 17), dtype, device)


def test_unknown_approximate_is_rejected():
    with pytest.raises(ValueError, match="approximate: expected one of 'none', 'tanh', got 'fast'"):
        ops.GELU(approximate="fast")
