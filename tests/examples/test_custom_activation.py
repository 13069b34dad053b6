"""examples/custom_activation.py runs on the CPU (its kernels through the interpreter): its
declared activations agree fused, unfused and with plain torch, its plans show them fused, its
property tests pass, and its last line starts with OK."""

import importlib.util
from pathlib import Path

import pytest

from fuseops.kernels._triton import INTERPRET

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_activation.py"


@pytest.mark.skipif(not INTERPRET, reason="the example's CPU run needs TRITON_INTERPRET=1 (set by the conftest)")
def test_custom_activation_example_prints_ok(capsys):
    spec = importlib.util.spec_from_file_location("custom_activation_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main()
    out = capsys.readouterr().out
    assert "('ForwardLinearBiasActivation', (1, 2))" in out
    assert "expert MLP plan, forward:  [('GroupedMLP', (0, 1, 2))]" in out
    assert "expert MLP plan, backward: [('GroupedMLP', (0, 1, 2))]" in out
    assert out.strip().splitlines()[-1].startswith("OK")


@pytest.mark.gpu
def test_custom_activation_example_on_cuda(capsys):
    spec = importlib.util.spec_from_file_location("custom_activation_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main()
    out = capsys.readouterr().out
    assert "expert_layer T=32768 E=128 top-8, SwiGLUAgain" in out
    assert out.strip().splitlines()[-1].startswith("OK")
