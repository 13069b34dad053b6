"""``expert_layer`` under torch.compile: its forward and backward as the custom operators
``fuseops::expert_layer_forward`` / ``_backward`` (``fuseops/moe/expert_layer_steps.py``), whose
fake implementations agree with the real ones (``torch.library.opcheck``), traced without a graph
break at two token counts in a row, equal to the eager layer."""

from __future__ import annotations

import pytest
import torch

from fuseops.moe import expert_layer, expert_layer_steps
from tests.moe.test_expert_layer import make_experts, routing, step


def _forward_args(T, keep, weighted, gather=False):
    experts = make_experts(4, 32, 16, bias=True)
    fc1, act, fc2 = experts
    x = torch.randn(T, 32)
    ids = routing(T, 4, 2, T)
    weights = torch.rand(T, 2) if weighted else None
    gate = expert_layer_steps.Gate(act.act, act.kernel_args)
    return (x, weights, fc1.weight.detach(), fc1.bias.detach(), fc2.weight.detach(), ids, *gate.fields(), keep, gather,
            "host")


@pytest.mark.parametrize("T", [0, 5])
@pytest.mark.parametrize("keep, gather", [(True, False), (False, False), (False, True)],
                         ids=["default", "default-inference", "lean"])
@pytest.mark.parametrize("weighted", [True, False])
def test_forward_operator_passes_opcheck(T, keep, gather, weighted):
    torch.library.opcheck(torch.ops.fuseops.expert_layer_forward.default, _forward_args(T, keep, weighted, gather))


@pytest.mark.parametrize("needs", [(True,) * 5, (True, False, True, False, True), (False, False, True, True, False)])
@pytest.mark.parametrize("lean", [False, True])
def test_backward_operator_passes_opcheck(lean, needs):
    args = _forward_args(5, not lean, True, gather=lean)
    y, row_map, z, probs, offsets = torch.ops.fuseops.expert_layer_forward.default(*args)
    x, _, w1, b1, w2 = args[:5]
    saved = (x, None if lean else z, probs, row_map, offsets, w1, b1, w2)
    torch.library.opcheck(torch.ops.fuseops.expert_layer_backward.default,
                          (torch.randn_like(y), *saved, *args[6:11], lean, list(needs), False, False))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("lean", [False, True], ids=["default", "lean"])
def test_compiled_layer_at_two_token_counts_equals_eager(lean, backend):
    """fullgraph=True, forward and backward, 16 then 9 tokens (no recompile per count: dynamic),
    each equal to the eager layer (the grouped GEMMs, the routing kernels' references); the traced
    graph calls the layer's two operators."""
    torch._dynamo.reset()
    experts = make_experts(4, 32, 16, bias=True)
    seen = []

    def count_ops(gm, example_inputs):
        # The Function's forward and backward are subgraphs of autograd_function_apply.
        for module in gm.modules():
            if isinstance(module, torch.fx.GraphModule):
                seen.extend(str(n.target) for n in module.graph.nodes if n.op == "call_function")
        return gm
    compiled = torch.compile(lambda *a: expert_layer(*a, experts, lean=lean), backend=backend, fullgraph=True,
                             dynamic=True)
    for T in (16, 9):
        x, ids, w, dy = torch.randn(T, 32), routing(T, 4, 2, T), torch.rand(T, 2), torch.randn(T, 32)
        eager = step(experts, x, ids, w, dy, lean)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        for p in experts.parameters():
            p.grad = None
        y = compiled(xr, ids, wr)
        y.backward(dy)
        got = [y.detach(), xr.grad, wr.grad] + [p.grad for p in experts.parameters()]
        for a, b in zip(got, eager, strict=True):
            torch.testing.assert_close(a, b)
    traced = torch.compile(lambda *a: expert_layer(*a, experts, lean=lean), backend=count_ops, fullgraph=True)
    traced(torch.randn(6, 32, requires_grad=True), routing(6, 4, 2, 6), torch.rand(6, 2))
    assert {"fuseops.expert_layer_forward.default", "fuseops.expert_layer_backward.default"} <= set(seen), seen
