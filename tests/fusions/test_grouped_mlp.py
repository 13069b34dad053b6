"""The fused expert MLP against a per-expert float64 loop (outputs, input, weight, bias
and probability grads), and on CUDA: no host sync, CUDA-graph capture."""

import copy

import pytest
import torch
import torch.nn.functional as F

import fuseops
from fuseops import ops
from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from tests.helpers import DTYPES, REL_TOL, assert_close_rel, capture_cuda_graph, rel_err
from tests.ops.harness import devices

E, H, FFN = 4, 16, 12


def _model(device, dtype, scaled, bias, gate=None):
    return fuseops.Sequential(
        ops.GroupedLinear(E, H, 2 * FFN, bias=bias),
        gate if gate is not None else ops.SwiGLU(scaled=scaled),
        ops.GroupedLinear(E, FFN, H, bias=bias),
    ).to(device=device, dtype=dtype)


def _swiglu(z):
    a, b = z.chunk(2, -1)
    return F.silu(a) * b


def _clamped_interleaved(z, limit=7.0, alpha=1.702):
    """gpt-oss's gate (ops.ClampedSwiGLU(interleaved=True) with its defaults)."""
    a, b = z[:, 0::2].clamp(max=limit), z[:, 1::2].clamp(-limit, limit)
    return a * torch.sigmoid(alpha * a) * (b + 1)


def _loop(x, w1, b1, w2, b2, probs, sizes, gate=_swiglu):
    outs, start = [], 0
    for g, n in enumerate(sizes):
        z = x[start : start + n] @ w1[g].T + (b1[g] if b1 is not None else 0)
        h = gate(z)
        if probs is not None:
            h = h * probs[start : start + n, None]
        outs.append(h @ w2[g].T + (b2[g] if b2 is not None else 0))
        start += n
    return torch.cat(outs)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sizes", [[5, 0, 9, 2], [16, 0, 0, 0], [0, 0, 0, 1]])
@pytest.mark.parametrize("scaled, bias", [(False, False), (True, True)])
def test_fused_expert_mlp_matches_per_expert_float64_loop(device, dtype, sizes, scaled, bias):
    model = _model(device, dtype, scaled, bias)
    rows = sum(sizes)
    x = torch.randn(rows, H, device=device, dtype=dtype, requires_grad=True)
    split = torch.tensor(sizes, device=device)
    probs = torch.rand(rows, device=device, requires_grad=True)
    extras = [split, probs, split] if scaled else [split, split]
    y = model(x, *extras)
    assert model.plan.forward == [("GroupedMLP", (0, 1, 2))]
    dy = torch.randn_like(y)
    y.backward(dy)

    p64 = {n: p.detach().double().requires_grad_() for n, p in model.named_parameters()}
    x64 = x.detach().double().requires_grad_()
    probs64 = probs.detach().double().requires_grad_() if scaled else None
    y64 = _loop(x64, p64["0.weight"], p64.get("0.bias"), p64["2.weight"], p64.get("2.bias"), probs64, sizes)
    y64.backward(dy.double())
    assert_close_rel(y.detach(), y64.detach(), dtype, 2, what="output")
    assert_close_rel(x.grad, x64.grad, dtype, 2, what="dx")
    for name, p in model.named_parameters():
        assert_close_rel(p.grad, p64[name].grad, dtype, 2, what=f"{name} grad")
    if scaled:
        # One row's probability gradient is a single dot product that can cancel:
        # hold it to the unfused ops' own error when that exceeds the tolerance.
        unfused = copy.deepcopy(model)
        unfused.fuse = False
        probs_ref = probs.detach().clone().requires_grad_()
        unfused(x.detach(), split, probs_ref, split).backward(dy)
        bound = max(REL_TOL[dtype] * 2, 2 * rel_err(probs_ref.grad, probs64.grad))
        assert rel_err(probs.grad, probs64.grad) <= bound, "probs grad"


@pytest.mark.skipif(not INTERPRET, reason="the interpreter runs only on CPU-only machines")
@pytest.mark.parametrize("gate", ["swiglu", "clamped_interleaved"])
@pytest.mark.parametrize(
    "dtype, needs",
    [(dtype, "all") for dtype in DTYPES]
    + [(torch.bfloat16, "fc2_params_only"), (torch.bfloat16, "no_fc2_weight")],
)
def test_fused_gated_kernels_match_per_expert_float64_loop(dtype, gate, needs):
    """The Triton kernels (interpreted): the gated FC1 forward, the gated FC2 dgrad (dz,
    dprobs and h for FC2's wgrad), and the paths where only some gradients are wanted."""
    sizes = [5, 0, 40, 3]
    op = ops.SwiGLU(scaled=True) if gate == "swiglu" else ops.ClampedSwiGLU(interleaved=True, scaled=True)
    model = _model("cpu", dtype, True, True, gate=op)
    with torch.no_grad():
        # Pre-activations beyond the clamp limit on both sides.
        model[0].weight.mul_(10.0)
    rows = sum(sizes)
    # fc2_params_only: FC2's input needs no gradient (h recomputed alone); no_fc2_weight: the
    # gated dgrad runs without writing h.
    x = torch.randn(rows, H, dtype=dtype, requires_grad=needs != "fc2_params_only")
    probs = torch.rand(rows, requires_grad=needs != "fc2_params_only")
    split = torch.tensor(sizes)
    frozen = {"all": (), "fc2_params_only": ("0.weight", "0.bias"), "no_fc2_weight": ("2.weight",)}[needs]
    for name, p in model.named_parameters():
        p.requires_grad_(name not in frozen)
    unfused = copy.deepcopy(model)
    unfused.fuse = False
    with interpreted_kernels():
        y = model(x, split, probs, split)
        dy = torch.randn_like(y)
        y.backward(dy)
        leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in (x, probs)]
        y_unfused = unfused(leaves[0], split, leaves[1], split)
        y_unfused.backward(dy)
    assert model.plan.forward == [("GroupedMLP", (0, 1, 2))]

    p64 = {n: p.detach().double().requires_grad_() for n, p in model.named_parameters()}
    x64 = x.detach().double().requires_grad_()
    probs64 = probs.detach().double().requires_grad_()
    y64 = _loop(x64, p64["0.weight"], p64["0.bias"], p64["2.weight"], p64["2.bias"], probs64, sizes,
                _swiglu if gate == "swiglu" else _clamped_interleaved)
    y64.backward(dy.double())
    cases = [("output", y, y_unfused, y64), ("dx", x, leaves[0], x64), ("dprobs", probs, leaves[1], probs64)]
    cases += [(f"{n} grad", p, q, p64[n]) for (n, p), q in zip(model.named_parameters(), unfused.parameters())]
    for what, t, t_unfused, t64 in cases:
        if what != "output":
            if not t.requires_grad:
                assert t.grad is None, what
                continue
            t, t_unfused, t64 = t.grad, t_unfused.grad, t64.grad
        # bf16 rounding of z flips clamp decisions near the limit: hold the fused ops to
        # the unfused ops' own error where that exceeds the tolerance.
        bound = max(REL_TOL[dtype] * 2, 2 * rel_err(t_unfused.detach(), t64.detach()))
        assert rel_err(t.detach(), t64.detach()) <= bound, what


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("gate", ["swiglu", "gelu"])
def test_retain_graph_keeps_z_for_a_second_backward(device, gate):
    """A backward that frees the graph writes dz over z (the peak-memory saving measured by
    benchmarks/moe_layer.py); under ``retain_graph`` z must stay intact: a second backward
    gives exactly the first's gradients, and both equal a freeing backward's."""
    act = ops.SwiGLU(scaled=True) if gate == "swiglu" else ops.GELU()
    model = fuseops.Sequential(
        ops.GroupedLinear(E, H, 2 * FFN if gate == "swiglu" else FFN), act, ops.GroupedLinear(E, FFN, H)
    ).to(device)
    sizes = [5, 0, 9, 2]
    split = torch.tensor(sizes, device=device)
    x = torch.randn(sum(sizes), H, device=device, requires_grad=True)
    probs = torch.rand(sum(sizes), device=device, requires_grad=True)
    extras = [split, probs, split] if gate == "swiglu" else [split, split]
    dy = torch.randn(sum(sizes), H, device=device)

    def grads(retain):
        for t in (x, probs, *model.parameters()):
            t.grad = None
        y = model(x, *extras)
        y.backward(dy, retain_graph=retain)
        first = [t.grad.clone() for t in (x, *model.parameters())]
        if retain:
            for t in (x, *model.parameters()):
                t.grad = None
            y.backward(dy)
            assert all(torch.equal(a, t.grad) for a, t in zip(first, (x, *model.parameters())))
        return first

    freed, kept = grads(False), grads(True)
    assert model.plan.forward == [("GroupedMLP", (0, 1, 2))]
    assert all(torch.equal(a, b) for a, b in zip(freed, kept))


def _step(model, x, split, probs, dy):
    for t in (x, probs, *model.parameters()):
        t.grad = None
    y = model(x, split, probs, split)
    y.backward(dy)
    return [y, x.grad, probs.grad] + [p.grad for p in model.parameters()]


@pytest.mark.gpu
def test_no_host_sync_in_fused_expert_mlp():
    model = _model("cuda", torch.bfloat16, True, True)
    x = torch.randn(256, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(256, device="cuda", requires_grad=True)
    split = torch.tensor([100, 0, 100, 56], device="cuda")
    dy = torch.randn(256, H, device="cuda", dtype=torch.bfloat16)
    _step(model, x, split, probs, dy)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _step(model, x, split, probs, dy)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_fused_expert_mlp_captures_in_a_cuda_graph():
    model = _model("cuda", torch.bfloat16, True, True)
    x = torch.randn(256, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(256, device="cuda", requires_grad=True)
    split = torch.tensor([64, 64, 64, 64], device="cuda")
    dy = torch.randn(256, H, device="cuda", dtype=torch.bfloat16)
    graph, static = capture_cuda_graph(lambda: _step(model, x, split, probs, dy))
    for sizes in ([10, 0, 200, 46], [256, 0, 0, 0]):
        split.copy_(torch.tensor(sizes))
        graph.replay()
        torch.cuda.synchronize()
        captured = [t.clone() for t in static]
        for a, b in zip(captured, _step(model, x, split, probs, dy)):
            torch.testing.assert_close(a, b)
