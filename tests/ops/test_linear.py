import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import ops
from tests.helpers import DTYPES
from tests.ops.harness import check_op_against_float64, devices


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape", [(7, 24), (2, 3, 24), (1, 24)])
def test_linear_matches_float64(device, dtype, bias, x_shape):
    op = ops.Linear(24, 10, bias=bias)
    check_op_against_float64(op, lambda x, p: F.linear(x, p["weight"], p.get("bias")), x_shape, dtype, device)


def test_state_dict_interchangeable_with_torch_linear():
    ours, theirs = ops.Linear(5, 3), torch.nn.Linear(5, 3)
    ours.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(4, 5)
    torch.testing.assert_close(fuseops.Sequential(ours)(x), theirs(x))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_accumulate_into_main_grad(device, dtype):
    op = ops.Linear(16, 8, accumulate_into_main_grad=True, device=device, dtype=dtype)
    op.weight.main_grad = torch.ones(8, 16, device=device, dtype=torch.float32)
    x = torch.randn(5, 16, device=device, dtype=dtype)
    dy = torch.randn(5, 8, device=device, dtype=dtype)
    fuseops.Sequential(op)(x).backward(dy)
    expected = 1.0 + dy.double().t() @ x.double()
    torch.testing.assert_close(op.weight.main_grad.double(), expected, rtol=1e-2, atol=1e-2)
    assert op.weight.grad is None
    assert op.bias.grad is not None


def test_main_grad_missing_is_a_clear_error():
    op = ops.Linear(4, 4, accumulate_into_main_grad=True)
    with pytest.raises(ValueError, match="main_grad"):
        fuseops.Sequential(op)(torch.randn(2, 4)).sum().backward()


@pytest.mark.parametrize(
    "kwargs, match",
    [({"in_features": 0, "out_features": 3}, "in_features"), ({"in_features": 3, "out_features": -1}, "out_features"),
     ({"in_features": 3, "out_features": 2, "dtype": torch.int32}, "dtype")],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        ops.Linear(**kwargs)


def test_bad_inputs_name_what_was_expected():
    model = fuseops.Sequential(ops.Linear(8, 4))
    with pytest.raises(ValueError, match=r"expected shape \[\.\.\., 8\], got \[2, 7\]"):
        model(torch.randn(2, 7))
    with pytest.raises(TypeError, match="int64"):
        model(torch.ones(2, 8, dtype=torch.int64))
    with pytest.raises(TypeError, match="does not match Linear.weight"):
        model(torch.randn(2, 8, dtype=torch.float16))
    with pytest.raises(TypeError, match="torch.Tensor"):
        model([1.0] * 8)


@pytest.mark.gpu
def test_device_mismatch_is_a_clear_error():
    model = fuseops.Sequential(ops.Linear(8, 4))
    with pytest.raises(ValueError, match="device"):
        model(torch.randn(2, 8, device="cuda"))
