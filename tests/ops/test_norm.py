import pytest
import torch
import torch.nn.functional as F

from fuseops import ops
from tests.helpers import DTYPES
from tests.ops.harness import check_op_against_float64, devices


def _layernorm(zero_centered):
    def ref(x, p):
        w = p["weight"] + 1 if zero_centered else p["weight"]
        return F.layer_norm(x, x.shape[-1:], w, p["bias"], 1e-5)

    return ref


def _rmsnorm(zero_centered):
    def ref(x, p):
        w = p["weight"] + 1 if zero_centered else p["weight"]
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * w

    return ref


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("cls, ref", [(ops.LayerNorm, _layernorm), (ops.RMSNorm, _rmsnorm)])
def test_norm_matches_float64(device, dtype, zero_centered, cls, ref):
    op = cls(33, zero_centered_gamma=zero_centered)
    check_op_against_float64(op, ref(zero_centered), (4, 3, 33), dtype, device)


def test_state_dict_matches_torch_layer_norm():
    ours, theirs = ops.LayerNorm(6), torch.nn.LayerNorm(6)
    assert ours.state_dict().keys() == theirs.state_dict().keys()


def test_bad_arguments():
    with pytest.raises(ValueError, match="normalized_shape"):
        ops.RMSNorm(0)
    with pytest.raises(ValueError, match="eps"):
        ops.LayerNorm(4, eps=-1.0)
