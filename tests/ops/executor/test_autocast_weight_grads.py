"""Float32 parameters under ``torch.autocast(bfloat16)``: each weight gradient is the float32 sum
of the 16-bit operands' products, written by the GEMM itself (not a bf16 result cast after),
for Linear, GroupedLinear and the fused expert MLP, fused equal to unfused, eager equal to
compiled. The float64 reference takes the same bf16 operands; a bf16-rounded gradient is
~1.6e-3 off it, float32's tolerance x 10 is 1e-4."""

from __future__ import annotations

import contextlib

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.fusions import backward_quantized_gated_mlp
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.ops import _autocast
from fuseops.quant import recipes
from tests.helpers import assert_close_rel

BF16 = torch.bfloat16
# The float32 sums of bf16 products: float32's tolerance, with room for the order of additions.
NOT_ROUNDED = {"dtype": torch.float32, "factor": 10}


def _runs():
    """(device, kernels): CPU through the torch references and, under the interpreter, through
    the Triton kernels; CUDA through what the dispatch table picks (the Gluon wgrad on sm_90)."""
    runs = [("cpu", "torch")]
    if INTERPRET:
        runs.append(("cpu", "triton"))
    runs.append(pytest.param("cuda", "gpu", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]))
    return runs


def _kernels(kernels: str):
    return interpreted_kernels() if kernels == "triton" else contextlib.nullcontext()


def _grouped_wgrad_float64(dy, x, sizes):
    return torch.stack([dy[r].double().T @ x[r].double() for r in _row_slices(sizes)])


def _row_slices(sizes):
    start = 0
    for n in sizes:
        yield slice(start, start + n)
        start += n


def _backward(seq, x, extras, g):
    with torch.autocast(x.device.type, dtype=BF16):
        y = seq(x, *extras)
    assert y.dtype == BF16
    y.backward(g)


@pytest.mark.parametrize("device, kernels", _runs())
def test_linear_weight_grad_is_the_float32_sum(device, kernels):
    torch.manual_seed(0)
    lin = ops.Linear(24, 16).to(device)
    x = torch.randn(5, 24, device=device, requires_grad=True)
    g = torch.randn(5, 16, device=device, dtype=BF16)
    with _kernels(kernels):
        _backward(fuseops.Sequential(lin), x, (), g)
    assert lin.weight.grad.dtype == torch.float32
    ref = g.double().T @ x.detach().to(BF16).double()
    assert_close_rel(lin.weight.grad, ref, **NOT_ROUNDED, what="dW")


@pytest.mark.parametrize("device, kernels", _runs())
def test_grouped_linear_weight_grad_is_the_float32_sum(device, kernels):
    torch.manual_seed(0)
    sizes = [5, 0, 17, 1]
    op = ops.GroupedLinear(4, 24, 16).to(device)
    x = torch.randn(sum(sizes), 24, device=device, requires_grad=True)
    g = torch.randn(sum(sizes), 16, device=device, dtype=BF16)
    with _kernels(kernels):
        _backward(fuseops.Sequential(op), x, (torch.tensor(sizes, device=device),), g)
    assert op.weight.grad.dtype == torch.float32
    ref = _grouped_wgrad_float64(g, x.detach().to(BF16), sizes)
    assert_close_rel(op.weight.grad, ref, **NOT_ROUNDED, what="dW")
    assert torch.count_nonzero(op.weight.grad[1]) == 0, "the empty group's gradient is not exactly zero"


def _expert_mlp(device, fuse):
    torch.manual_seed(0)
    return fuseops.Sequential(ops.GroupedLinear(3, 16, 48, bias=True), ops.SwiGLU(), ops.GroupedLinear(3, 24, 16),
                              fuse=fuse).to(device)


def _bf16_values(t: torch.Tensor) -> float:
    """The share of ``t``'s elements that a bf16 holds exactly (all of them, for a bf16 result
    cast to float32)."""
    return (t == t.to(BF16).float()).float().mean().item()


@pytest.mark.parametrize("device, kernels", _runs())
def test_expert_mlp_weight_grads_fused_equal_unfused_and_keep_float32(device, kernels):
    sizes = [7, 0, 9]
    x = torch.randn(sum(sizes), 16, device=device)
    g = torch.randn(sum(sizes), 16, device=device, dtype=BF16)
    split = torch.tensor(sizes, device=device)
    grads = {}
    for fuse in (False, True):
        seq = _expert_mlp(device, fuse)
        with _kernels(kernels):
            _backward(seq, x, (split, split), g)
        assert (seq.plan.forward == [("GroupedMLP", (0, 1, 2))]) == fuse
        grads[fuse] = [p.grad for p in seq.parameters()]
    for name, unfused, fused in zip(("w1", "b1", "w2"), grads[False], grads[True]):
        assert fused.dtype == unfused.dtype == torch.float32
        assert_close_rel(fused, unfused, BF16, what=f"{name}: fused against unfused")
    # The weight gradients are float32 sums, not bf16 values cast: most elements are not bf16's.
    for name, i in (("w1", 0), ("w2", 2)):
        for fuse in (False, True):
            assert _bf16_values(grads[fuse][i]) < 0.5, f"{name} (fuse={fuse}) looks rounded to bf16"


def test_grouped_weight_grad_compiled_equals_eager():
    """Under torch.compile the grouped wgrad is a custom op whose fake result has the
    parameter's dtype; the compiled float32 gradient is the eager one."""
    sizes = torch.tensor([6, 0, 5])
    x = torch.randn(11, 16)
    g = torch.randn(11, 16, dtype=BF16)

    def run(compiled: bool) -> list[torch.Tensor]:
        seq = _expert_mlp("cpu", True)

        def step(x, sizes):
            with torch.autocast("cpu", dtype=BF16):
                return seq(x, sizes, sizes)

        fn = torch.compile(step, backend="aot_eager", fullgraph=True) if compiled else step
        fn(x, sizes).backward(g)
        return [p.grad for p in seq.parameters()]

    torch._dynamo.reset()
    for eager, compiled in zip(run(False), run(True)):
        assert compiled.dtype == torch.float32
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fuse", [False, True])
def test_expert_mlp_casts_each_weight_once_per_version(monkeypatch, fuse):
    """Forward and backward of every step share one bf16 copy of each parameter until an
    optimizer step changes it (the backward never casts again)."""
    built = []
    real = _autocast.derived

    def counting(param, kind, build, **kw):
        return real(param, kind, lambda p: built.append(kind) or build(p), **kw)

    monkeypatch.setattr(_autocast, "derived", counting)
    seq = _expert_mlp("cpu", fuse)
    opt = torch.optim.SGD(seq.parameters(), lr=0.1)
    sizes = torch.tensor([4, 3, 0])
    x = torch.randn(7, 16, requires_grad=True)
    for _ in range(3):
        _backward(seq, x, (sizes, sizes), torch.randn(7, 16, dtype=BF16))
    assert len(built) == 3  # w1, b1, w2
    opt.step()
    _backward(seq, x, (sizes, sizes), torch.randn(7, 16, dtype=BF16))
    assert len(built) == 6


@pytest.mark.parametrize("recipe", [recipes.FP8CurrentScaling(), recipes.FP8Blockwise()], ids=["fp8", "fp8-block"])
def test_quantized_weight_grads_under_autocast_keep_float32(recipe, monkeypatch):
    """A recipe nested in torch.autocast: the scaled wgrad GEMMs write the float32 parameters'
    gradients in float32 (Linear, GroupedLinear, and the quantized gated MLP's backward, switched
    on here: it declines these formats by measurement)."""
    monkeypatch.setattr(backward_quantized_gated_mlp, "DECLINED", ())
    torch.manual_seed(0)
    sizes = [20, 0, 44]
    split = torch.tensor(sizes)
    models = {
        "Linear": (fuseops.Sequential(ops.Linear(64, 128)), ()),
        "GroupedLinear": (fuseops.Sequential(ops.GroupedLinear(3, 64, 128)), (split,)),
        "gated MLP": (fuseops.Sequential(ops.GroupedLinear(3, 64, 256), ops.SwiGLU(), ops.GroupedLinear(3, 128, 64)),
                      (split, split)),
    }
    x = torch.randn(64, 64)
    for name, (seq, extras) in models.items():
        with torch.autocast("cpu", dtype=BF16), fuseops.autocast(recipe=recipe):
            y = seq(x, *extras)
        y.backward(torch.randn_like(y))
        if name == "gated MLP":
            assert ("BackwardQuantizedGatedMLP", (0, 1, 2)) in seq.plan.backward
        for p in seq.parameters():
            if p.dim() > 1:
                assert p.grad.dtype == torch.float32
                assert _bf16_values(p.grad) < 0.5, f"{name}: {tuple(p.shape)} looks rounded to bf16"
