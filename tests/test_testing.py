"""fuseops.testing.check_activation on every shipped activation: the property tests a user's
declared activation gets (tests/ops/test_declared_activation.py) hold for the built-ins, through
the interpreter on the CPU and on CUDA."""

import pytest
import torch

from fuseops import ops
from fuseops.kernels._triton import INTERPRET
from fuseops.testing import check_activation

SHIPPED = [
    ops.ReLU(), ops.GELU(), ops.GELU(approximate="tanh"), ops.SiLU(), ops.SReLU(), ops.Sigmoid(),
    ops.SwiGLU(), ops.GeGLU(), ops.GeGLU(approximate="none"), ops.ReGLU(), ops.SReGLU(),
    ops.ClampedSwiGLU(), ops.ClampedSwiGLU(limit=1.5, interleaved=True),
]


def _id(op) -> str:
    return f"{type(op).__name__}({op.extra_repr()})".replace(" ", "")


def test_every_shipped_activation_is_listed():
    bases = (ops.ActivationOp, ops.GatedActivation)
    shipped = {c for c in vars(ops).values() if isinstance(c, type) and issubclass(c, bases)}
    assert {type(op) for op in SHIPPED} == shipped - {ops.ActivationOp, ops.GatedActivation}


@pytest.mark.skipif(not INTERPRET, reason="the kernels on CPU tensors need TRITON_INTERPRET=1")
@pytest.mark.parametrize("op", SHIPPED, ids=_id)
def test_shipped_activation_passes(op):
    check_activation(op, device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", SHIPPED, ids=_id)
def test_shipped_activation_passes_on_cuda(op, dtype):
    check_activation(op, dtype=dtype, device="cuda")
