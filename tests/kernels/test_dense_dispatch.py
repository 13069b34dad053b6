"""The dense GEMM's shape-aware dispatch: the rule against its measured source, the row's
``when`` on fake device properties, the forced branches, and the routing through the table."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch

from fuseops.kernels import dense_dispatch
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.dense_dispatch import Branch, Epilogue, choose, force_branch, forced_branch, prefers_cublas
from fuseops.kernels.dispatch import Backend, Kernel, _callable, launcher
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import dense, dense_cublas
from tests.helpers import assert_bitwise, is_sm90

SOURCE = pathlib.Path(__file__).parents[2] / "benchmarks" / "results" / "session14" / "dense_dispatch.json"
CLASS = {"bias": Epilogue.BIAS, "bias+gelu": Epilogue.ACTIVATION, "bias+residual": Epilogue.RESIDUAL}


@pytest.fixture(autouse=True)
def _table_mode():
    force_branch(None)
    yield
    force_branch(None)


def _branch_of_cell(cell: dict, sms: int) -> Branch:
    tiles_m, tiles_n = math.ceil(cell["M"] / 128), math.ceil(cell["N"] / 128)
    return choose(tiles_m, tiles_n, CLASS[cell["epilogue"]], sms)


def test_rule_errs_on_the_measured_cells_as_its_docstring_says():
    cells = json.loads(SOURCE.read_text())["cells"]
    assert len(cells) == 72
    wrong, worst = 0, 1.0
    for cell in cells:
        fused, cublas = cell["fuseops_graphed_us"], cell["cublas_graphed_us"]
        picked = fused if _branch_of_cell(cell, sms=132) is Branch.FUSED else cublas
        if picked > min(fused, cublas):
            wrong += 1
            worst = max(worst, picked / min(fused, cublas))
    assert wrong == 10 and worst < 1.06, (wrong, worst)


def test_rule_on_fake_devices():
    # 132 SMs (H100 SXM): 128 tiles below a wave, 256 above.
    assert choose(8, 16, Epilogue.ACTIVATION, 132) is Branch.CUBLAS
    assert choose(8, 32, Epilogue.ACTIVATION, 132) is Branch.FUSED
    assert choose(1, 132, Epilogue.RESIDUAL, 132) is Branch.FUSED
    assert choose(1, 131, Epilogue.BIAS, 132) is Branch.CUBLAS
    # Fewer SMs move the threshold with them (H100 PCIe: 114).
    assert choose(8, 16, Epilogue.ACTIVATION, 114) is Branch.FUSED
    # Not measured: an activation and a residual; an empty output launches nothing either way.
    assert choose(1, 1, Epilogue.ACTIVATION_RESIDUAL, 132) is Branch.FUSED
    assert choose(0, 8, Epilogue.BIAS, 132) is Branch.FUSED


def _forward(m, k, n, dtype=torch.bfloat16):
    torch.manual_seed(0)
    a = torch.randn(m, k).to(dtype)
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    return a, w.t(), torch.randn(n).to(dtype)


def test_when_serves_the_measured_call_class_only():
    # On this machine num_sms(-1) is 4 (no CUDA / the interpreter): one 128x128 tile is below a wave.
    a, b, bias = _forward(64, 16, 64)
    assert prefers_cublas(a, b, bias=bias, act=Activation.GELU_TANH, save_preact=True)
    assert prefers_cublas(a, b, bias=bias, residual=torch.randn(64, 64).to(torch.bfloat16))
    assert not prefers_cublas(a, b.t().contiguous(), bias=bias)  # dgrad layout: not measured
    assert not prefers_cublas(a, b, act=Activation.GELU, act_grad_input=torch.randn(64, 64).to(torch.bfloat16))
    assert not prefers_cublas(a, b, bias=bias.float())  # a float32 bias: the fused kernel's
    assert not prefers_cublas(a, b, out=torch.empty(64, 64, dtype=torch.bfloat16))
    assert not prefers_cublas(a.half(), b.half(), bias=bias.half())  # fp16: not measured
    assert not prefers_cublas(a, b, bias=bias, act=Activation.RELU, residual=torch.randn(64, 64).to(torch.bfloat16))
    a, b, bias = _forward(512, 16, 128)  # 4 tiles: a wave of 4 SMs
    assert not prefers_cublas(a, b, bias=bias, act=Activation.GELU_TANH)


def test_forced_branches_and_the_environment(monkeypatch):
    a, b, bias = _forward(512, 16, 128)
    force_branch("cublas")
    assert prefers_cublas(a, b, bias=bias)
    assert prefers_cublas(a.float(), b.float(), bias=bias.float())  # any dtype when forced
    assert not prefers_cublas(a, b.t().contiguous(), bias=bias)  # never outside its call class
    force_branch(Branch.FUSED)
    assert not prefers_cublas(*_forward(64, 16, 64)[:2])
    monkeypatch.setattr(dense_dispatch, "_forced", dense_dispatch._UNREAD)
    monkeypatch.setenv(dense_dispatch.ENV, "cublas")
    assert forced_branch() is Branch.CUBLAS
    monkeypatch.setattr(dense_dispatch, "_forced", dense_dispatch._UNREAD)
    monkeypatch.setenv(dense_dispatch.ENV, "table")
    assert forced_branch() is None
    monkeypatch.setattr(dense_dispatch, "_forced", dense_dispatch._UNREAD)
    monkeypatch.setenv(dense_dispatch.ENV, "cuBLAS ")
    with pytest.raises(ValueError, match="FUSEOPS_DENSE_DISPATCH='cuBLAS '.*'table', 'fused', 'cublas'"):
        forced_branch()


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_sm90_routing_runs_the_branch_the_table_picks():
    routed = _callable(Kernel.GEMM, Backend.SM90)
    for (m, k, n), branch in (((64, 16, 64), dense_cublas.gemm), ((512, 16, 128), dense.gemm)):
        a, b, bias = _forward(m, k, n)
        epi = dict(bias=bias, act=Activation.GELU_TANH, save_preact=True)
        with interpreted_kernels():
            y, z = routed(a, b, **epi)
            want_y, want_z = branch(a, b, **epi)
            other_y, _ = (dense.gemm if branch is dense_cublas.gemm else dense_cublas.gemm)(a, b, **epi)
        assert_bitwise(y, want_y, "y")
        assert_bitwise(z, want_z, "preact")
        # The two branches round differently, so the bitwise match says which one ran.
        assert not torch.equal(y, other_y)


@pytest.mark.gpu
@pytest.mark.skipif(not is_sm90(), reason="the table's row is sm_90's")
def test_cuda_launcher_consults_the_table():
    device = torch.device("cuda")
    small = [t.to(device) for t in _forward(64, 4096, 1024)]  # 8 tiles
    large = [t.to(device) for t in _forward(2048, 1024, 4096)]  # 512 tiles
    for (a, b, bias), branch in ((small, dense_cublas.gemm), (large, dense.gemm)):
        epi = dict(bias=bias, act=Activation.GELU_TANH, save_preact=True)
        y, z = launcher(Kernel.GEMM, a)(a, b, **epi)
        want_y, want_z = branch(a, b, **epi)
        assert_bitwise(y, want_y, "y")
        assert_bitwise(z, want_z, "preact")
    a, b, bias = small
    force_branch("fused")
    assert_bitwise(launcher(Kernel.GEMM, a)(a, b, bias=bias)[0], dense.gemm(a, b, bias=bias)[0], "forced fused")
