"""Session 20: on torch 2.11 the compiled expert_layer's gradients are all 100 % off (call 2: AOT's backward
graph replaces the incoming gradient by zeros). Which part of _ExpertLayer makes Dynamo treat its output
as non-differentiable: variants patched in one process, backend "eager" and "aot_eager"."""
import sys

import torch

sys.path.insert(0, ".")
import importlib

from fuseops.kernels import library
from fuseops.kernels.moe import traceable
from fuseops.moe import expert_layer

el = importlib.import_module("fuseops.moe.expert_layer")
from tests.moe.test_expert_layer import make_experts, routing, step

print(torch.__version__)
experts = make_experts(4, 32, 16, bias=True)
x, ids, w, dy = torch.randn(16, 32), routing(16, 4, 2, 0), torch.rand(16, 2), torch.randn(16, 32)
eager = step(experts, x, ids, w, dy, False)
orig_bwd = el._ExpertLayer.backward
orig_sum = el._sum_rows


def run(name, backend="aot_eager"):
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: expert_layer(*a, experts), backend=backend, fullgraph=True)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    for p in experts.parameters():
        p.grad = None
    try:
        y = compiled(xr, ids, wr)
        info = f"y.requires_grad={y.requires_grad} grad_fn={type(y.grad_fn).__name__}"
        y.backward(dy)
        got = [xr.grad] + [p.grad for p in experts.parameters()]
        ratios = [None if g is None else round(float(g.norm() / e.norm()), 4) for g, e in zip(got, [eager[1]] + eager[3:])]
        print(f"{name:28s} {backend:9s} {info} |grad|/|eager grad| {ratios}")
    except Exception as e:  # noqa: BLE001
        print(f"{name:28s} {backend:9s} raised {type(e).__name__}: {str(e)[:200]}")


for backend in ("eager", "aot_eager"):
    run("as is", backend)
el._ExpertLayer.backward = staticmethod(orig_bwd.__wrapped__)
run("no once_differentiable")
el._ExpertLayer.backward = orig_bwd
el._sum_rows = lambda rows, row_map: traceable.unpermute(rows, row_map, None)
run("sum_rows as custom op")
el._sum_rows = orig_sum
orig_fallback = el.expert_layer_fallback
el.expert_layer_fallback = lambda *a: "composition"
run("the composition path")
el.expert_layer_fallback = orig_fallback


class MinimalOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, offsets):
        ctx.save_for_backward(a, b, offsets)
        y, _ = library.grouped_gemm(a, b, offsets)
        return y

    @staticmethod
    def backward(ctx, dy):
        a, b, offsets = ctx.saved_tensors  # noqa: RUF059
        return dy @ b[0].T, None, None


class MinimalTorch(MinimalOp):
    @staticmethod
    def forward(ctx, a, b, offsets):
        ctx.save_for_backward(a, b, offsets)
        return a @ b[0]


for cls in (MinimalOp, MinimalTorch):
    a = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(2, 16, 16)
    offsets = torch.tensor([0, 4, 8])
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        f = torch.compile(lambda a: cls.apply(a, b, offsets), backend=backend, fullgraph=True)  # noqa: B023 (called in this iteration)
        a.grad = None
        y = f(a)
        y.backward(torch.ones_like(y))
        print(f"{cls.__name__:12s} {backend:9s} y.requires_grad={y.requires_grad} grad norm {float(a.grad.norm()):.4f} "
              f"(expected {float((torch.ones(8, 16) @ b[0].T).norm()):.4f})")
