import pytest
import torch

import fuseops
from fuseops import ops
from tests.helpers import DTYPES
from tests.ops.harness import check_op_against_float64, devices


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_and_reshape(device, dtype):
    check_op_against_float64(ops.Identity(), lambda x, p: x, (3, 4), dtype, device)
    check_op_against_float64(ops.Reshape((-1, 2)), lambda x, p: x.reshape(-1, 2), (3, 4), dtype, device)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias(dtype):
    check_op_against_float64(ops.Bias(6), lambda x, p: x + p["bias"], (5, 6), dtype, "cpu")


def test_dropout_train_and_eval():
    op = ops.Dropout(0.5)
    model = fuseops.Sequential(op)
    x = torch.ones(64, 64, requires_grad=True)
    y = model(x)
    kept = y != 0
    assert 0.3 < kept.float().mean() < 0.7
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 2.0))
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() * 2.0)
    model.eval()
    torch.testing.assert_close(model(x), x)


def test_bad_arguments():
    with pytest.raises(ValueError, match="p: expected a float in"):
        ops.Dropout(1.5)
    with pytest.raises(ValueError, match="cannot be reshaped"):
        fuseops.Sequential(ops.Reshape((5,)))(torch.randn(2, 3))
    with pytest.raises(ValueError, match="shape"):
        ops.Reshape((-1, -1))


def test_reshape_takes_an_int_as_torch_does():
    model = fuseops.Sequential(ops.Reshape(4))
    x = torch.randn(2, 2, requires_grad=True)
    y = model(x)
    assert torch.equal(y, x.reshape(4))
    y.sum().backward()
    assert x.grad.shape == (2, 2)


@pytest.mark.parametrize("bad, exc", [("4", TypeError), (4.0, TypeError), ((2, -1, -1), ValueError),
                                      ((0, 2), ValueError), ((True,), ValueError)])
def test_reshape_rejects_bad_shapes(bad, exc):
    with pytest.raises(exc, match=r"shape: expected"):
        ops.Reshape(bad)
