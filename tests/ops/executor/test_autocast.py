"""torch.autocast with float32 parameters: each test against the same model built from
torch.nn (or torch ops) under the same autocast, fused and unfused."""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.ops import _autocast
from fuseops.quant import weight_cache
from tests.helpers import assert_close_rel, cpu_and_cuda

LOW = [torch.bfloat16, torch.float16]


def _grads(params):
    return [p.grad for p in params]


def _dense(H, fuse, device, norm):
    Norm, NnNorm = (ops.LayerNorm, torch.nn.LayerNorm) if norm == "layer" else (ops.RMSNorm, torch.nn.RMSNorm)
    seq = fuseops.Sequential(
        ops.MakeExtraOutput(), Norm(H), ops.Linear(H, 2 * H), ops.GELU(), ops.Linear(2 * H, H), ops.AddExtraInput(),
        fuse=fuse,
    ).to(device)
    ref = torch.nn.ModuleList([NnNorm(H, eps=1e-5), torch.nn.Linear(H, 2 * H), torch.nn.GELU(), torch.nn.Linear(2 * H, H)])
    ref = ref.to(device)
    with torch.no_grad():
        for p in seq.parameters():
            p.uniform_(-0.5, 0.5)
        for mine, theirs in zip([seq[1], seq[2], seq[4]], [ref[0], ref[1], ref[3]]):
            for name, p in theirs.named_parameters():
                p.copy_(getattr(mine, name))
    return seq, ref


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_dense_block_matches_torch_nn_under_autocast(device, dtype, fuse, norm):
    torch.manual_seed(0)
    H = 16
    seq, ref = _dense(H, fuse, device, norm)
    x = torch.randn(3, 5, H, device=device, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    with torch.autocast(device, dtype=dtype):
        y = seq(x, x)[0]  # (y, branch): the residual added back is x itself
        h = ref[0](xr)
        yr = ref[3](ref[2](ref[1](h))) + xr
    assert y.dtype == yr.dtype
    assert_close_rel(y.float(), yr.float(), dtype, what="y")
    g = torch.randn_like(y)
    y.backward(g)
    yr.backward(g)
    assert x.grad.dtype == xr.grad.dtype == torch.float32
    assert_close_rel(x.grad, xr.grad, dtype, what="dx")
    mine = [p for op in (seq[1], seq[2], seq[4]) for p in op.parameters()]
    theirs = [p for m in (ref[0], ref[1], ref[3]) for p in m.parameters()]
    for p, q in zip(mine, theirs):
        assert p.grad.dtype == torch.float32
        assert_close_rel(p.grad, q.grad, dtype, factor=2, what=f"grad {tuple(p.shape)}")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", LOW)
def test_norm_output_dtype_follows_torch(device, dtype):
    H = 8
    for Mine, Theirs in ((ops.LayerNorm, torch.nn.LayerNorm), (ops.RMSNorm, torch.nn.RMSNorm)):
        mine, theirs = Mine(H).to(device), Theirs(H).to(device)
        for x_dtype in (torch.float32, dtype):
            x = torch.randn(4, H, device=device, dtype=x_dtype)
            with torch.autocast(device, dtype=dtype):
                y, yr = mine(x), theirs(x)
            assert y.dtype == yr.dtype, (Mine.__name__, x_dtype)
            assert_close_rel(y.float(), yr.float(), dtype)


def _grouped_reference(x, weight, bias, sizes):
    out, start = [], 0
    for g, n in enumerate(sizes):
        out.append(torch.nn.functional.linear(x[start:start + n], weight[g], None if bias is None else bias[g]))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("fuse", [False, True])
def test_grouped_mlp_matches_torch_under_autocast(device, fuse):
    torch.manual_seed(1)
    dtype, H, I, sizes = torch.bfloat16, 8, 12, [3, 0, 5]
    seq = fuseops.Sequential(ops.GroupedLinear(3, H, I, bias=True), ops.GELU(), ops.GroupedLinear(3, I, H), fuse=fuse).to(device)
    x = torch.randn(8, H, device=device, requires_grad=True)
    w1, b1, w2 = (p.detach().clone().requires_grad_() for p in (seq[0].weight, seq[0].bias, seq[2].weight))
    xr = x.detach().clone().requires_grad_()
    with torch.autocast(device, dtype=dtype):
        y = seq(x, sizes, sizes)
        h = torch.nn.functional.gelu(_grouped_reference(xr, w1, b1, sizes))
        yr = _grouped_reference(h, w2, None, sizes)
    assert y.dtype == yr.dtype == dtype
    if fuse:
        assert seq.plan.forward == [("GroupedMLP", (0, 1, 2))]
    assert_close_rel(y.float(), yr.float(), dtype)
    g = torch.randn_like(y)
    y.backward(g)
    yr.backward(g)
    assert_close_rel(x.grad, xr.grad, dtype, what="dx")
    for p, q in zip((seq[0].weight, seq[0].bias, seq[2].weight), (w1, b1, w2)):
        assert p.grad.dtype == torch.float32
        assert_close_rel(p.grad, q.grad, dtype, factor=2, what="param grad")


def test_weight_cast_once_per_version():
    w = torch.nn.Parameter(torch.randn(4, 4))
    a = _autocast.cast_param(torch.bfloat16, w)
    assert a is _autocast.cast_param(torch.bfloat16, w)
    assert weight_cache.cached_bytes() >= a.numel() * 2
    with torch.no_grad():
        w.add_(1.0)
    b = _autocast.cast_param(torch.bfloat16, w)
    assert b is not a
    torch.testing.assert_close(b, w.detach().to(torch.bfloat16))


def test_linear_forward_reuses_the_cast_weight(monkeypatch):
    lin = ops.Linear(8, 4)
    built = []
    real = weight_cache.derived

    def counting(param, kind, build, **kw):
        return real(param, kind, lambda p: built.append(kind) or build(p), **kw)

    monkeypatch.setattr(_autocast, "derived", counting)
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lin(x)
        lin(x)
    assert built.count(("autocast", torch.bfloat16)) == 2  # weight and bias, once each
    with torch.no_grad():
        lin.weight.mul_(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    assert built.count(("autocast", torch.bfloat16)) == 3
    torch.testing.assert_close(y, torch.nn.functional.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16()))


def test_dtype_mismatch_outside_autocast_still_raises():
    seq = fuseops.Sequential(ops.LayerNorm(8), ops.Linear(8, 4))
    with pytest.raises(TypeError, match="does not match LayerNorm.weight"):
        seq(torch.randn(2, 8, dtype=torch.bfloat16))


def test_plan_cache_keyed_on_autocast():
    seq = fuseops.Sequential(ops.Linear(8, 8), ops.GELU(), ops.Linear(8, 8))
    x = torch.randn(2, 8, requires_grad=True)
    seq(x)
    plain = seq.plan
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = seq(x)
    assert y.dtype == torch.bfloat16 and seq.plan is not plain
    seq(x)
    assert seq.plan is plain
