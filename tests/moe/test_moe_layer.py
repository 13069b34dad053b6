"""The whole MoE expert layer (permute, fused grouped MLP, unpermute), forward and backward,
captures in a CUDA graph and replays correctly after new routing is copied into the same
tensors (no host sync anywhere on the path)."""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.moe import permute, unpermute
from tests.helpers import REL_TOL, capture_cuda_graph, cuda_or_skip, rel_err, reroutable


@pytest.mark.gpu
@pytest.mark.parametrize("scaled", [True, False], ids=["probs-in-swiglu", "weights-in-unpermute"])
def test_moe_layer_forward_backward_captures_in_cuda_graph(scaled):
    device = cuda_or_skip()
    E, T, H, I, K = 8, 384, 128, 96, 2
    bf16 = dict(device=device, dtype=torch.bfloat16)
    torch.manual_seed(0)
    mlp = fuseops.Sequential(
        ops.GroupedLinear(E, H, 2 * I, **bf16), ops.SwiGLU(scaled=scaled), ops.GroupedLinear(E, I, H, **bf16)
    )
    x = torch.randn(T, H, **bf16).requires_grad_()
    ids, weights, route = reroutable(T, E, K, device)
    dy = torch.randn(T, H, **bf16)
    leaves = [x, weights, *mlp.parameters()]

    def step() -> torch.Tensor:
        for t in leaves:
            t.grad = None
        x_sorted, split_sizes, row_map = permute(x, ids, E)
        if scaled:
            probs = weights.new_empty(T * K).scatter(0, row_map.reshape(-1), weights.reshape(-1))
            y = unpermute(mlp(x_sorted, split_sizes, probs, split_sizes), row_map, None)
        else:
            y = unpermute(mlp(x_sorted, split_sizes, split_sizes), row_map, weights)
        y.backward(dy)
        return y

    route(1)
    ref = [step().detach()] + [t.grad.clone() for t in leaves]
    assert [idx for _, idx in mlp.plan.backward] == [(0, 1, 2)]

    route(2)
    graph, y_static = capture_cuda_graph(step)

    # Replayed under routing 1, which the graph was not captured with.
    route(1)
    graph.replay()
    torch.cuda.synchronize()
    got = [y_static] + [t.grad for t in leaves]
    for name, g, r in zip(("y", "dx", "dweights", "dw1", "dw2"), got, ref):
        # Equal up to bf16 rounding (an atomic reduction may add in another order).
        assert rel_err(g, r) <= REL_TOL[torch.bfloat16], f"{name}: replay differs from eager by {rel_err(g, r):.2e}"
