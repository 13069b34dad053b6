"""The grouped launchers hand ``launch`` the same arguments as before their per-call work was
cut (tests/kernels/launch_capture.py): descriptors by base, shape, strides, block and layout."""

import json

import pytest
import torch

from tests.kernels.launch_capture import GOLDEN, capture_all


# Without CUDA the persistent grids count 4 SMs, as when the golden files were written.
@pytest.mark.skipif(torch.cuda.is_available(), reason="golden arguments hold a CPU-only machine's SM count")
def test_launch_arguments_equal_the_golden_ones():
    golden = json.loads(GOLDEN.read_text())
    got = json.loads(json.dumps(capture_all()))
    assert got.keys() == golden.keys()
    for name in golden:
        assert got[name] == golden[name], name


def test_capture_tells_descriptors_apart():
    # The check can fail: a descriptor's layout, block and base all reach the plain data.
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tests.kernels.launch_capture import plain

    t = torch.zeros(8, 64, dtype=torch.bfloat16)
    one = TensorDescriptor.from_tensor(t, [8, 64], gl.NVMMASharedLayout.get_default_for([8, 64], gl.bfloat16))
    other = TensorDescriptor.from_tensor(t, [8, 64], gl.NVMMASharedLayout.get_default_for([8, 64], gl.float32))
    named = {"t": t}
    assert plain(one, named) != plain(other, named)
    assert plain(one, named)[1] == ["tensor", ["t", 0], [8, 64], [64, 1], "torch.bfloat16"]


if __name__ == "__main__":
    pytest.main([__file__])
