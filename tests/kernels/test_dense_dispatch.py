"""The dense GEMMs' shape-aware dispatch (the forward epilogues, the gated GEMM, the dgrad
epilogues; bf16, fp16, float32): the rules against their measured sources, the rows' ``when``
on fake device properties, the forced branches and the routing through the table. The cuBLAS
branches themselves: tests/kernels/gemm/test_dense_cublas.py."""

from __future__ import annotations

import copy
import json
import math
import pathlib

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.kernels import dense_dispatch
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.dense_dispatch import (
    Branch,
    Epilogue,
    choose,
    force_branch,
    forced_branch,
    prefers_cublas,
    prefers_cublas_gated,
)
from fuseops.kernels.dispatch import Backend, Kernel, _callable, launcher
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.elementwise.gated_activation import reference_gated_fwd
from fuseops.kernels.gemm import dense, dense_cublas, dense_gated
from tests.helpers import REL_TOL, assert_bitwise, assert_close_rel, is_sm90, rel_err, sm90_routes

# The H100 tables the sm_90 rows were fitted on (``python -m benchmarks.dense_dispatch``).
SOURCE = pathlib.Path(__file__).parents[2] / "benchmarks" / "results" / "dense_dispatch-h100-2026-11-27.json"
CLASS = {"bias": Epilogue.BIAS, "bias+gelu": Epilogue.ACTIVATION, "bias+residual": Epilogue.RESIDUAL}


def _cells(table: str) -> list[dict]:
    return json.loads(SOURCE.read_text())["tables"][table]["cells"]


GATED_CLASS = {"bias+swiglu": Epilogue.GATED, "bias+swiglu+saved": Epilogue.GATED_SAVED}


@pytest.fixture(autouse=True)
def _table_mode():
    force_branch(None)
    yield
    force_branch(None)


def _errors(cells: list[dict], epilogue: Epilogue, n_per_tile: int = 128) -> tuple[int, float]:
    """Of a measured table's cells: how many the rule sends to the slower branch (graphed GPU
    time, an H100's 132 SMs), and by how much at worst. ``n_per_tile``: 256 for the gated GEMM,
    whose output tiles count the F = N / 2 columns of y."""
    wrong, worst = 0, 1.0
    for cell in cells:
        branch = choose(math.ceil(cell["M"] / 128), math.ceil(cell["N"] / n_per_tile), epilogue, 132)
        fused, cublas = cell["fuseops_graphed_us"], cell["cublas_graphed_us"]
        picked = fused if branch is Branch.FUSED else cublas
        if picked > min(fused, cublas):
            wrong += 1
            worst = max(worst, picked / min(fused, cublas))
    return wrong, worst


def test_rule_errs_on_the_measured_cells_as_its_docstring_says():
    cells = _cells("forward")
    assert len(cells) == 72
    wrong, worst = 0, 1.0
    for name, epilogue in CLASS.items():
        w, x = _errors([c for c in cells if c["epilogue"] == name], epilogue)
        wrong, worst = wrong + w, max(worst, x)
    assert wrong == 10 and worst < 1.06, (wrong, worst)


def test_gated_rules_err_on_the_measured_cells_as_the_docstring_says():
    cells = _cells("gated")
    assert len(cells) == 60
    for epilogue, (want_wrong, want_worst) in {"bias+swiglu": (3, 1.05), "bias+swiglu+saved": (7, 1.08)}.items():
        wrong, worst = _errors([c for c in cells if c["epilogue"] == epilogue], GATED_CLASS[epilogue], 256)
        assert wrong == want_wrong and worst < want_worst, (epilogue, wrong, worst)


DGRAD_CLASS = {"dgrad+gelu": Epilogue.DGRAD_ACTIVATION, "dgrad+residual": Epilogue.DGRAD_RESIDUAL}


@pytest.mark.parametrize("table, epilogue, want_wrong, want_worst", [
    ("dgrad_gelu_remeasured", "dgrad+gelu", 6, 1.07), ("dgrad", "dgrad+gelu", 6, 1.08), ("dgrad", "dgrad+residual", 2, 1.03)])
def test_dgrad_rules_err_on_the_measured_cells_as_the_docstring_says(table, epilogue, want_wrong, want_worst):
    cells = [c for c in _cells(table) if c["epilogue"] == epilogue]
    assert len(cells) == 30
    wrong, worst = _errors(cells, DGRAD_CLASS[epilogue])
    assert wrong == want_wrong and worst < want_worst, (wrong, worst)


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
    # The gated GEMM: 2 waves without the pre-activation saved, 3 with it.
    assert choose(8, 32, Epilogue.GATED, 132) is Branch.CUBLAS
    assert choose(8, 33, Epilogue.GATED, 132) is Branch.FUSED
    assert choose(8, 33, Epilogue.GATED_SAVED, 132) is Branch.CUBLAS
    assert choose(8, 49, Epilogue.GATED_SAVED, 132) is Branch.CUBLAS
    assert choose(8, 50, Epilogue.GATED_SAVED, 132) is Branch.FUSED
    # The dgrad epilogues: act'(z) from 2 waves, a residual from 1.
    assert choose(8, 32, Epilogue.DGRAD_ACTIVATION, 132) is Branch.CUBLAS
    assert choose(8, 33, Epilogue.DGRAD_ACTIVATION, 132) is Branch.FUSED
    assert choose(4, 32, Epilogue.DGRAD_RESIDUAL, 132) is Branch.CUBLAS
    assert choose(4, 33, Epilogue.DGRAD_RESIDUAL, 132) is Branch.FUSED


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
    assert not prefers_cublas(a, b.t().contiguous(), bias=bias)  # dgrad layout: no bias there
    # act'(z) on the forward orientation: not measured.
    assert not prefers_cublas(a, b, act=Activation.GELU, act_grad_input=torch.randn(64, 64).to(torch.bfloat16))
    assert not prefers_cublas(a, b, bias=bias.float())  # a float32 bias: the fused kernel's
    assert not prefers_cublas(a, b, out=torch.empty(64, 64, dtype=torch.bfloat16))
    assert prefers_cublas(a.half(), b.half(), bias=bias.half())  # fp16: the bf16 rule
    assert not prefers_cublas(a, b, bias=bias, act=Activation.RELU, residual=torch.randn(64, 64).to(torch.bfloat16))
    a, b, bias = _forward(512, 16, 128)  # 4 tiles: a wave of 4 SMs
    assert not prefers_cublas(a, b, bias=bias, act=Activation.GELU_TANH)
    assert not prefers_cublas(a.half(), b.half(), bias=bias.half(), act=Activation.GELU_TANH)
    # float32: cuBLAS at any size and epilogue (its IEEE products run off the tensor cores in the fused kernel).
    assert prefers_cublas(a.float(), b.float(), bias=bias.float(), act=Activation.GELU_TANH)
    assert prefers_cublas(a.float(), b.float(), bias=bias.float(), act=Activation.RELU, residual=torch.randn(512, 128))
    assert not prefers_cublas(a.double(), b.double(), bias=bias.double())  # float64: not measured


def test_gated_when_serves_the_measured_call_class_only():
    # num_sms(-1) is 4 here: 2 waves are 8 tiles of y, 3 waves 12.
    a, b, bias = _forward(64, 16, 64)  # y [64, 32]: one tile
    swiglu = dict(bias=bias, act=Activation.SILU)
    assert prefers_cublas_gated(a, b, **swiglu)
    assert prefers_cublas_gated(a, b, **swiglu, save_preact=True, interleaved=True)
    assert prefers_cublas_gated(a, b, act=Activation.GELU_TANH, clamped=True)  # any gate, no bias
    assert prefers_cublas_gated(a, b, **swiglu, out=torch.empty(64, 32, dtype=torch.bfloat16))
    assert not prefers_cublas_gated(a, b.t().contiguous(), **swiglu)  # not a weight's transpose
    assert not prefers_cublas_gated(a, b, bias=bias.float(), act=Activation.SILU)
    assert not prefers_cublas_gated(a, b, **swiglu, out=torch.empty(64, 32))  # a float32 out
    assert not prefers_cublas_gated(a, b, **swiglu, out=torch.empty(32, 64, dtype=torch.bfloat16).t())
    assert prefers_cublas_gated(a.half(), b.half(), bias=bias.half(), act=Activation.SILU)  # fp16: bf16's rule
    assert not prefers_cublas_gated(a.double(), b.double(), bias=bias.double(), act=Activation.SILU)
    a, b, bias = _forward(1024, 16, 256)  # y [1024, 128]: 8 tiles, 2 waves
    assert not prefers_cublas_gated(a, b, bias=bias, act=Activation.SILU)
    assert prefers_cublas_gated(a, b, bias=bias, act=Activation.SILU, save_preact=True)
    a, b, bias = _forward(1536, 16, 256)  # 12 tiles, 3 waves
    assert not prefers_cublas_gated(a, b, bias=bias, act=Activation.SILU, save_preact=True)
    assert prefers_cublas_gated(a.float(), b.float(), bias=bias.float(), act=Activation.SILU, save_preact=True)


def test_dgrad_when_serves_the_measured_call_classes_only():
    # dy [64, 16] @ W [16, 64] (W row-major, the forward's weight as it is): one tile, below a wave of 4 SMs.
    dy, w_t, _ = _forward(64, 16, 64)
    w = w_t.contiguous()  # [16, 64] row-major
    z = torch.randn(64, 64).to(torch.bfloat16)
    assert prefers_cublas(dy, w, act=Activation.GELU_TANH, act_grad_input=z)
    assert prefers_cublas(dy, w, residual=z)
    assert not prefers_cublas(dy, w)  # no epilogue: the Linear's own dgrad is torch's
    assert not prefers_cublas(dy, w, act=Activation.GELU_TANH, act_grad_input=z, residual=z)  # both: not measured
    assert not prefers_cublas(dy, w, bias=torch.zeros(64, dtype=torch.bfloat16), residual=z)
    assert not prefers_cublas(dy, w, act=Activation.GELU_TANH, act_grad_input=z.float())
    assert not prefers_cublas(dy, w, residual=z, save_preact=True)
    assert not prefers_cublas(dy, w, residual=z, out=torch.empty_like(z))
    assert prefers_cublas(dy.half(), w.half(), residual=z.half())  # fp16: bf16's rule
    assert not prefers_cublas(dy.double(), w.double(), residual=z.double())
    # 512 x 64 outputs: 4 tiles, one wave: the residual class is fused from there, act'(z) from 2 waves.
    dy, z = torch.randn(512, 16).to(torch.bfloat16), torch.randn(512, 64).to(torch.bfloat16)
    assert not prefers_cublas(dy, w, residual=z)
    assert prefers_cublas(dy, w, act=Activation.GELU_TANH, act_grad_input=z)
    dy, z = torch.randn(1024, 16).to(torch.bfloat16), torch.randn(1024, 64).to(torch.bfloat16)
    assert not prefers_cublas(dy, w, act=Activation.GELU_TANH, act_grad_input=z)
    assert prefers_cublas(dy.float(), w.float(), act=Activation.GELU_TANH, act_grad_input=z.float())


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("epilogue", ["act_grad", "residual"])
def test_sm90_dgrad_routing_runs_the_branch_the_table_picks_and_both_are_the_unfused_ops(epilogue):
    routed = _callable(Kernel.GEMM, Backend.SM90)
    torch.manual_seed(0)
    w = (torch.randn(16, 64) / 4).to(torch.bfloat16)
    for m, branch in ((64, dense_cublas.gemm), (1024, dense.gemm)):  # 1 and 8 tiles of 4 SMs
        dy, z = torch.randn(m, 16).to(torch.bfloat16), torch.randn(m, 64).to(torch.bfloat16)
        epi = dict(act=Activation.GELU_TANH, act_grad_input=z) if epilogue == "act_grad" else dict(residual=z)
        with interpreted_kernels():
            y, none = routed(dy, w, **epi)
            want, _ = branch(dy, w, **epi)
            other, _ = (dense.gemm if branch is dense_cublas.gemm else dense_cublas.gemm)(dy, w, **epi)
        assert none is None
        assert_bitwise(y, want, "dx")
        assert not torch.equal(y, other)
        # Both branches: the unfused ops in float64 (the product rounded to bf16 in cuBLAS's).
        ref, _ = dense.reference_gemm(dy.double(), w.double(), **{k: (v.double() if torch.is_tensor(v) else v)
                                                                  for k, v in epi.items()})
        assert_close_rel(y, ref, torch.bfloat16, what=f"dx ({branch.__module__})")
        assert_close_rel(other, ref, torch.bfloat16, what="the other branch's dx")


def test_forced_branches_and_the_environment(monkeypatch):
    a, b, bias = _forward(512, 16, 128)
    force_branch("cublas")
    assert prefers_cublas(a, b, bias=bias)
    assert prefers_cublas(a.float(), b.float(), bias=bias.float())  # any dtype when forced
    assert not prefers_cublas(a, b.t().contiguous(), bias=bias)  # never outside its call class
    assert prefers_cublas_gated(a, b, bias=bias, act=Activation.SILU)  # the gated row too
    assert not prefers_cublas_gated(a, b.t().contiguous(), act=Activation.SILU)
    force_branch(Branch.FUSED)
    assert not prefers_cublas(*_forward(64, 16, 64)[:2])
    assert not prefers_cublas_gated(*_forward(64, 16, 64)[:2], act=Activation.SILU)
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


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_sm90_routing_sends_float32_to_cublas_at_any_size():
    """float32 products: cuBLAS's (the fused kernels' IEEE float32 runs off the tensor cores)."""
    a, b, bias = (t.float() for t in _forward(512, 16, 128))  # a full wave of 4 SMs: fused in bf16
    epi = dict(bias=bias, act=Activation.GELU_TANH, save_preact=True)
    gated = _callable(Kernel.GEMM_GATED, Backend.SM90)
    with interpreted_kernels():
        y, z = _callable(Kernel.GEMM, Backend.SM90)(a, b, **epi)
        want_y, want_z = dense_cublas.gemm(a, b, **epi)
        g, gz = gated(a, b, bias=bias, act=Activation.SILU, save_preact=True)
        want_g, want_gz = dense_cublas.gemm_gated(a, b, bias=bias, act=Activation.SILU, save_preact=True)
        fused_y, _ = dense.gemm(a, b, **epi)
    assert not torch.equal(y, fused_y)  # the branches round differently: the match above says which ran
    for out, want, what in ((y, want_y, "y"), (z, want_z, "preact"), (g, want_g, "gated y"), (gz, want_gz, "gated z")):
        assert_bitwise(out, want, what)
    ref, _ = dense.reference_gemm(a.double(), b.double(), bias=bias.double(), act=Activation.GELU_TANH)
    assert_close_rel(y, ref, torch.float32, what="y against float64")


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_sm90_gated_routing_runs_the_branch_the_table_picks():
    routed = _callable(Kernel.GEMM_GATED, Backend.SM90)
    for (m, k, n), branch in (((64, 16, 64), dense_cublas.gemm_gated), ((1024, 16, 256), dense_gated.gemm_gated)):
        a, b, bias = _forward(m, k, n)
        epi = dict(bias=bias, act=Activation.SILU)
        with interpreted_kernels():
            y, z = routed(a, b, **epi)
            want_y, want_z = branch(a, b, **epi)
            other_y, _ = (dense_gated.gemm_gated if branch is dense_cublas.gemm_gated else dense_cublas.gemm_gated)(
                a, b, **epi)
        assert_bitwise(y, want_y, "y")
        assert z is None and want_z is None
        assert not torch.equal(y, other_y)


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("autocast", [torch.bfloat16, None], ids=["autocast-bf16", "float32"])
def test_float32_weights_on_the_sm90_routes_train_as_float64_does(autocast):
    """A user's model, float32 weights, under ``torch.autocast`` or not, with the kernels
    routed as on an H100 (the gated, GELU and dgrad GEMMs through the dense rows: bf16 by
    the thresholds, float32 always cuBLAS): outputs and every gradient against the same model
    in float64, fused and unfused; gradients in the parameters' float32."""
    torch.manual_seed(0)
    h = 32
    fused = fuseops.Sequential(ops.RMSNorm(h), ops.Linear(h, 4 * h), ops.SwiGLU(), ops.Linear(2 * h, h),
                               ops.Linear(h, 2 * h), ops.GELU(approximate="tanh"), ops.Linear(2 * h, h))
    unfused = copy.deepcopy(fused)
    unfused.fuse = False
    exact = copy.deepcopy(fused).double()
    exact.fuse = False
    x = torch.randn(37, h)

    def step(model, x, dtype):
        x = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            y = model(x)
        y.double().square().sum().backward()
        return [y, x.grad, *(p.grad for p in model.parameters())]

    with interpreted_kernels(), sm90_routes():
        results = {"fused": step(fused, x, autocast), "unfused": step(unfused, x, autocast)}
    want = step(exact, x.double(), None)
    assert all(p.grad.dtype == torch.float32 for p in [*fused.parameters(), *unfused.parameters()])
    dtype = autocast or torch.float32
    for i, (f, u, w) in enumerate(zip(results["fused"], results["unfused"], want)):
        # Seven ops each rounding to ``dtype``: the chain's tolerance is a few of one op's;
        # fused within twice the unfused error (DESIGN.md's rule).
        assert_close_rel(u, w, dtype, factor=3, what=f"unfused output / gradient {i}")
        assert rel_err(f, w) <= max(2 * rel_err(u, w), REL_TOL[dtype] / 10), f"fused output / gradient {i}"


@pytest.mark.gpu
@pytest.mark.skipif(not is_sm90(), reason="the table's row is sm_90's")
def test_cuda_gated_launcher_consults_the_table():
    device = torch.device("cuda")
    small = [t.to(device) for t in _forward(64, 4096, 2 * 1024)]  # 8 tiles of y
    large = [t.to(device) for t in _forward(2048, 1024, 2 * 4096)]  # 512 tiles
    for (a, b, bias), branch in ((small, dense_cublas.gemm_gated), (large, dense_gated.gemm_gated)):
        for save_preact in (False, True):
            epi = dict(bias=bias, act=Activation.SILU, save_preact=save_preact)
            y, z = launcher(Kernel.GEMM_GATED, a)(a, b, **epi)
            want_y, want_z = branch(a, b, **epi)
            assert_bitwise(y, want_y, "y")
            assert_bitwise(z, want_z, "preact")
            assert_close_rel(y, reference_gated_fwd(torch.addmm(bias, a, b).double(), Activation.SILU),
                             torch.bfloat16, what="y against float64")
    a, b, bias = small
    force_branch("fused")
    y = launcher(Kernel.GEMM_GATED, a)(a, b, bias=bias, act=Activation.SILU)[0]
    assert_bitwise(y, dense_gated.gemm_gated(a, b, bias=bias, act=Activation.SILU)[0], "forced fused")


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
    a, b, bias = (t.float() for t in large)  # float32: cuBLAS at any size
    epi = dict(bias=bias, act=Activation.GELU_TANH, save_preact=True)
    for got, want, what in zip(launcher(Kernel.GEMM, a)(a, b, **epi), dense_cublas.gemm(a, b, **epi), ("y", "z")):
        assert_bitwise(got, want, f"float32 {what}")
    y, z = launcher(Kernel.GEMM_GATED, a)(a, b, bias=bias, act=Activation.SILU, save_preact=True)
    want_y, want_z = dense_cublas.gemm_gated(a, b, bias=bias, act=Activation.SILU, save_preact=True)
    assert_bitwise(y, want_y, "float32 gated y")
    assert_bitwise(z, want_z, "float32 gated z")
    a, b, bias = small
    force_branch("fused")
    assert_bitwise(launcher(Kernel.GEMM, a)(a, b, bias=bias)[0], dense.gemm(a, b, bias=bias)[0], "forced fused")


@pytest.mark.gpu
@pytest.mark.skipif(not is_sm90(), reason="the table's row is sm_90's")
def test_cuda_dgrad_launcher_consults_the_table():
    device = torch.device("cuda")
    torch.manual_seed(0)
    w = (torch.randn(1024, 4096, device=device) / 32).to(torch.bfloat16)  # the forward's [K, N] weight
    for m, branch in ((64, dense_cublas.gemm), (4096, dense.gemm)):  # 0.24 and 7.8 waves of 128x128 tiles
        dy = torch.randn(m, 1024, device=device).to(torch.bfloat16)
        z = torch.randn(m, 4096, device=device).to(torch.bfloat16)
        for epi in (dict(act=Activation.GELU_TANH, act_grad_input=z), dict(residual=z)):
            y, _ = launcher(Kernel.GEMM, dy)(dy, w, **epi)
            assert_bitwise(y, branch(dy, w, **epi)[0], f"dx {sorted(epi)}")
            ref, _ = dense.reference_gemm(dy.double(), w.double(), **{k: (v.double() if torch.is_tensor(v) else v)
                                                                      for k, v in epi.items()})
            assert_close_rel(y, ref, torch.bfloat16, what=f"dx {sorted(epi)} against float64")
