"""Session 20: tests/moe/test_expert_layer.py::test_compiles_without_graph_breaks fails on the device's
torch 2.11 (CPU tensors, aot_eager): y 100 % off. Which side is wrong (compiled, eager, against the
unfused composition), with which backend, and the traced graphs (TORCH_LOGS=graph_code,aot_graphs)."""
import sys

import torch

sys.path.insert(0, ".")
from fuseops.moe import expert_layer
from tests.moe.test_expert_layer import make_experts, routing, step, unfused

torch.manual_seed(0)
for lean in (False,):
    experts = make_experts(4, 32, 16, bias=True)
    x, ids, w, dy = torch.randn(16, 32), routing(16, 4, 2, 0), torch.rand(16, 2), torch.randn(16, 32)
    eager = step(experts, x, ids, w, dy, lean)
    plain = step(unfused(experts), x, ids, w, dy)
    names = ["y", "dx", "dw", "w1", "b1", "w2", "b2"]
    print("eager vs unfused:", {n: float((a - b).norm() / b.norm().clamp_min(1e-30)) for n, a, b in zip(names, eager, plain)})
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: expert_layer(*a, experts, lean=lean), backend=backend, fullgraph=True)  # noqa: B023 (called in this iteration)
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        for p in experts.parameters():
            p.grad = None
        y = compiled(xr, ids, wr)
        print(backend, "y norm", float(y.norm()), "eager y norm", float(eager[0].norm()), "zeros:", int((y == 0).sum()))
        y.backward(dy)
        got = [y.detach(), xr.grad, wr.grad] + [p.grad for p in experts.parameters()]
        print(backend, "vs eager:", {n: (None if a is None else float((a - b).norm() / b.norm().clamp_min(1e-30))) for n, a, b in zip(names, got, eager)})
