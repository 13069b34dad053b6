"""The dispatch table: one place, read as data, that every op asks."""

import pathlib
import re

import pytest
import torch

import fuseops
from fuseops.kernels import dispatch
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.dispatch import TABLE, Backend, Kernel, backend_of, launcher
from fuseops.kernels.gemm import grouped_wgrad
from fuseops.kernels.hopper import wgrad as hopper_wgrad

PACKAGE = pathlib.Path(fuseops.__file__).parent


def test_every_kernel_has_a_triton_and_a_reference_route_and_describe_lists_every_row():
    for kernel in Kernel:
        backends = [r.backend for r in TABLE if r.kernel is kernel]
        assert backends.count(Backend.TRITON) == 1 and backends.count(Backend.TORCH) == 1, kernel
    text = dispatch.describe()
    assert len(text.splitlines()) == len(TABLE) + 1
    for r in TABLE:
        assert r.runs.__name__ in text


def test_cpu_and_float64_run_the_references():
    x = torch.randn(4, 8)
    assert backend_of(x) is Backend.TORCH
    assert launcher(Kernel.GROUPED_GEMM_WGRAD, x) is grouped_wgrad.reference_grouped_gemm_wgrad
    assert backend_of(x.double()) is Backend.TORCH


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_interpreted_cpu_runs_the_triton_launchers():
    x = torch.randn(4, 8)
    with interpreted_kernels():
        assert backend_of(x) is Backend.TRITON
        assert launcher(Kernel.GROUPED_GEMM_WGRAD, x) is grouped_wgrad.grouped_gemm_wgrad
        # float64 stays on the references: the oracles' dtype.
        assert backend_of(x.double()) is Backend.TORCH


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_sm90_rows_are_tried_first_and_fall_through_to_triton():
    # On the interpreter no Gluon row serves, so the sm_90 routing must give the Triton result.
    routed = dispatch._callable(Kernel.GROUPED_GEMM_WGRAD, Backend.SM90)
    dy, x = torch.randn(6, 16), torch.randn(6, 8)
    offsets = torch.tensor([0, 2, 2, 6])
    assert not hopper_wgrad.serves(dy, x, offsets)
    with interpreted_kernels():
        got = routed(dy, x, offsets)
        expected = grouped_wgrad.grouped_gemm_wgrad(dy, x, offsets)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_no_layer_above_the_kernels_chooses_an_implementation_itself():
    # Ops, fusions, quant and moe reach kernels only through dispatch.launcher: no
    # reference_* launcher or backend test of their own (storage.dequantize's reference is
    # the only implementation of that maths, not a choice; ``reference_grad`` is the name of
    # ``declare_activation``'s argument, the user's torch derivative).
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("kernels/"):
            continue
        text = path.read_text()
        for m in re.finditer(r"\b(reference_(?!dequantize|grad\b)\w+|runs_triton\(|on_sm90\(|usable\()", text):
            if rel != "fuser.py" or m.group(1) != "runs_triton(":
                offenders.append(f"{rel}: {m.group(1)}")
    assert not offenders, offenders


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_backend():
    x = torch.randn(4, 8, device="cuda")
    expected = Backend.SM90 if torch.cuda.get_device_capability() == (9, 0) else Backend.TRITON
    assert backend_of(x) is expected


def test_torch_func_transforms_get_the_references(monkeypatch):
    """vmap runs the plan's Function on batched tensors (its generated vmap rule): they have no
    storage for a Triton kernel, so under any torch.func transform the launcher is the torch
    reference, whatever backend the tensor's device would pick (on CUDA the kernels failed
    with 'Cannot access data pointer of Tensor that doesn't have storage')."""
    monkeypatch.setattr(dispatch, "backend_of", lambda t: dispatch.Backend.TRITON)
    outside = dispatch.launcher(dispatch.Kernel.ACTIVATION_FWD, torch.zeros(2))
    assert outside is not dispatch._TRACED[dispatch.Kernel.ACTIVATION_FWD.value]
    seen = []

    def body(x):
        seen.append(dispatch.launcher(dispatch.Kernel.ACTIVATION_FWD, x))
        return x

    torch.func.vmap(body)(torch.zeros(3, 2))
    torch.func.grad(lambda x: body(x).sum())(torch.zeros(2))
    assert seen == [dispatch._TRACED[dispatch.Kernel.ACTIVATION_FWD.value]] * 2


def test_a_quantized_kernel_is_refused_while_torch_compile_traces():
    # The traced table leaves the quantized kernels out (they reach the compiler as custom ops).
    def ask(x):
        try:
            dispatch.launcher(dispatch.Kernel.QUANTIZE, x)
        except LookupError:
            return x + 1
        return x

    torch._dynamo.reset()
    x = torch.zeros(3)
    torch.testing.assert_close(torch.compile(ask, backend="eager", fullgraph=True)(x), x + 1)
    assert dispatch.launcher(dispatch.Kernel.GEMM, x) is not None
