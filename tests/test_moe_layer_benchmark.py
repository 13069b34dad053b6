"""``benchmarks/moe_layer.py`` and its implementations (``benchmarks/_moe_impls.py``) on the CPU:
SonicMoE's weight layout and routing inputs (the anchor itself runs on CUDA only, so its conversion
is checked here against a plain-torch model of what it computes), the skewed routing, and
``--smoke`` end to end."""

from __future__ import annotations

import importlib.util
import json

import torch
import torch.nn.functional as F

from benchmarks._moe_impls import fuseops_weight_grads, make_case, sonicmoe_routing, sonicmoe_weights, torch_moe
from benchmarks.moe_layer import ROUTINGS
from tests.helpers import run_python


def sonicmoe_reference(x: torch.Tensor, router_scores: torch.Tensor, token_indices: torch.Tensor,
                       expert_indices: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """What SonicMoE's ``moe_general_routing_inputs`` computes with SwiGLU, from its arguments:
    w1 [2I, H, E] (gate at even rows, up at odd rows), w2 [H, I, E], one (token, expert, score)
    per entry; ``y[t] = sum over t's entries of score * w2_e @ (silu(gate_e x_t) * up_e x_t)``."""
    tokens, experts = token_indices.long(), expert_indices.long()
    h = torch.einsum("nih,nh->ni", w1.permute(2, 0, 1)[experts], x[tokens])
    a = F.silu(h[:, 0::2]) * h[:, 1::2]
    out = torch.einsum("nhi,ni->nh", w2.permute(2, 0, 1)[experts], a) * router_scores[:, None].to(x.dtype)
    return torch.zeros_like(x).index_add(0, tokens, out)


def test_sonicmoe_weights_round_trip_bit_for_bit():
    w1, w2 = torch.randn(3, 10, 6), torch.randn(3, 6, 5)
    s1, s2 = sonicmoe_weights(w1, w2)
    assert s1.is_contiguous() and s2.is_contiguous()
    # Row 2j is gate row j, row 2j+1 up row j.
    assert torch.equal(s1[:, 0::2], w1[:, :5]) and torch.equal(s1[:, 1::2], w1[:, 5:])
    # SonicMoE's views: [2I, H, E] and [H, I, E], E outermost in memory (its stride order (2, 0, 1)).
    v1, v2 = s1.permute(1, 2, 0), s2.permute(1, 2, 0)
    assert v1.shape == (10, 6, 3) and v2.shape == (6, 5, 3)
    assert v1.stride(2) > v1.stride(0) > v1.stride(1) and v2.stride(2) > v2.stride(0) > v2.stride(1)
    back1, back2 = fuseops_weight_grads(s1, s2)
    assert torch.equal(back1, w1) and torch.equal(back2, w2)


def test_sonicmoe_inputs_compute_the_benchmark_layer_and_its_gradients():
    case = make_case(E=4, T=24, H=16, I=8, K=2, device="cpu", dtype=torch.float32)
    case.route(0, skewed=True)
    x, weights = case.x, case.weights
    y = torch_moe(x, case.ids, weights, case.w1, case.w2)
    y.backward(case.dy)
    ref = [y.detach(), x.grad, weights.grad, case.w1.grad, case.w2.grad]

    x2, weights2 = x.detach().requires_grad_(), weights.detach().requires_grad_()
    s1, s2 = (torch.nn.Parameter(w) for w in sonicmoe_weights(case.w1.detach(), case.w2.detach()))
    scores, tokens, experts = sonicmoe_routing(case.ids, weights2)
    assert scores.dtype == torch.float32 and tokens.dtype == experts.dtype == torch.int32
    assert bool((tokens[1:] >= tokens[:-1]).all())
    y2 = sonicmoe_reference(x2, scores, tokens, experts, s1.permute(1, 2, 0), s2.permute(1, 2, 0))
    y2.backward(case.dy)
    got = [y2.detach(), x2.grad, weights2.grad, *fuseops_weight_grads(s1.grad, s2.grad)]
    for name, g, r in zip(("y", "dx", "dweights", "dw1", "dw2"), got, ref, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_skewed_routing_sends_half_the_tokens_top1_to_expert_0():
    T, E, K = 64, 8, 3
    case = make_case(E=E, T=T, H=8, I=4, K=K, device="cpu", dtype=torch.float32)
    case.route(0, skewed=True)
    ids = case.ids.clone()
    case.route(0, skewed=True)
    assert torch.equal(case.ids, ids)
    assert bool((ids[::2, 0] == 0).all())
    # The top-1 slot holds the largest weight, and a token's K experts stay distinct.
    assert bool((case.weights[:, 0] == case.weights.max(-1).values).all())
    assert all(len(set(row.tolist())) == K for row in ids)
    assert int((ids == 0).sum()) >= T // 2
    case.route(0)
    assert int((case.ids == 0).sum()) < T // 2


def test_smoke_runs_every_new_path(tmp_path):
    impls = ["fuseops", "fuseops lean", "torch", "torch.compile", "sonicmoe"]
    done = run_python("-m", "benchmarks.moe_layer", "--smoke", "--impls", *impls, "--out-dir", str(tmp_path),
                      timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "sonicmoe skipped:" in done.stdout
    [results] = tmp_path.glob("moe_layer-cpu-*.json")
    # The plot needs matplotlib (the ``bench`` extra); the results file does not.
    assert results.with_suffix(".png").exists() or importlib.util.find_spec("matplotlib") is None
    rows = json.loads(results.read_text())["rows"]
    cells = {(r["routing"], r["mode"], r["impl"]) for r in rows}
    assert cells == {(routing, mode, impl) for routing in ROUTINGS for mode in ("fwd", "fwd+bwd")
                     for impl in impls if impl != "sonicmoe"}
    for r in rows:
        assert r["ms"] > 0 and r["loop_ms"] > 0 and r["peak_fraction"] > 0
        assert r["rel_err_vs_torch"]["y"] < 2e-2
