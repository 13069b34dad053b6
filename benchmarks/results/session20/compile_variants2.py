"""Session 20: torch 2.11 compiles some fuseops autograd Functions with a zero gradient on CPU (call 3:
expert_layer fixed by making its final row sum a custom op; tests/test_compile.py dense: x's gradient
100 % off). Localise: dense Sequential variants, and the expert layer's row sum as the traced reference
with variations (a trailing clone, no trailing .to)."""
import importlib
import sys

import torch

sys.path.insert(0, ".")
import fuseops
from fuseops import ops
from fuseops.kernels.moe import permute as permute_kernels
from fuseops.moe import expert_layer
from tests.moe.test_expert_layer import make_experts, routing, step

el = importlib.import_module("fuseops.moe.expert_layer")
print(torch.__version__)


def grads_ratio(model, call, x, backend="aot_eager"):
    out = {}
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        fn = call if mode == "eager" else torch.compile(call, backend=backend, fullgraph=True)
        xr = x.detach().clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        y = fn(model, xr)
        y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view_as(y))
        out[mode] = [xr.grad] + [p.grad for p in model.parameters()]
    return [None if c is None or e is None else round(float((c - e).norm() / e.norm()), 4)
            for c, e in zip(out["compiled"], out["eager"])]


torch.manual_seed(0)
x = torch.randn(10, 16)
variants = {
    "norm,lin,gelu,lin,add (x,x)": (lambda: fuseops.Sequential(ops.RMSNorm(16), ops.Linear(16, 32), ops.GELU(approximate="tanh"), ops.Linear(32, 16), ops.AddExtraInput()), lambda m, x: m(x, x)),
    "same, extra = x.clone()": (lambda: fuseops.Sequential(ops.RMSNorm(16), ops.Linear(16, 32), ops.GELU(approximate="tanh"), ops.Linear(32, 16), ops.AddExtraInput()), lambda m, x: m(x, x.clone())),
    "same, fuse=False (x,x)": (lambda: fuseops.Sequential(ops.RMSNorm(16), ops.Linear(16, 32), ops.GELU(approximate="tanh"), ops.Linear(32, 16), ops.AddExtraInput(), fuse=False), lambda m, x: m(x, x)),
    "lin,add (x,x)": (lambda: fuseops.Sequential(ops.Linear(16, 16), ops.AddExtraInput()), lambda m, x: m(x, x)),
    "lin,add (x,x) fuse=False": (lambda: fuseops.Sequential(ops.Linear(16, 16), ops.AddExtraInput(), fuse=False), lambda m, x: m(x, x)),
    "lin": (lambda: fuseops.Sequential(ops.Linear(16, 16)), lambda m, x: m(x)),
    "norm": (lambda: fuseops.Sequential(ops.RMSNorm(16)), lambda m, x: m(x)),
    "gelu": (lambda: fuseops.Sequential(ops.GELU(approximate="tanh")), lambda m, x: m(x)),
    "lin,gelu": (lambda: fuseops.Sequential(ops.Linear(16, 32), ops.GELU(approximate="tanh")), lambda m, x: m(x)),
    "norm,lin,gelu,lin": (lambda: fuseops.Sequential(ops.RMSNorm(16), ops.Linear(16, 32), ops.GELU(approximate="tanh"), ops.Linear(32, 16)), lambda m, x: m(x)),
}
for name, (build, call) in variants.items():
    try:
        print(f"{name:32s} rel err of [x.grad, params...]: {grads_ratio(build(), call, x)}")
    except Exception as e:  # noqa: BLE001
        print(f"{name:32s} raised {type(e).__name__}: {str(e)[:200]}")

experts = make_experts(4, 32, 16, bias=True)
xe, ids, w, dy = torch.randn(16, 32), routing(16, 4, 2, 0), torch.rand(16, 2), torch.randn(16, 32)
eager = step(experts, xe, ids, w, dy, False)


def run_expert(name):
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: expert_layer(*a, experts), backend="aot_eager", fullgraph=True)
    xr, wr = xe.clone().requires_grad_(), w.clone().requires_grad_()
    for p in experts.parameters():
        p.grad = None
    y = compiled(xr, ids, wr)
    y.backward(dy)
    got = [xr.grad] + [p.grad for p in experts.parameters()]
    print(f"expert layer, {name:28s} |grad|/|eager| {[round(float(g.norm() / e.norm()), 4) for g, e in zip(got, [eager[1]] + eager[3:])]}")


ref = permute_kernels.reference_unpermute
for name, fn in {
    "reference (as is)": lambda r, m: ref(r, m, None),
    "reference + clone": lambda r, m: ref(r, m, None).clone(),
    "index_select+sum only": lambda r, m: r.index_select(0, m.reshape(-1)).view(m.shape[0], m.shape[1], -1).sum(1),
    "index_select+sum+mul 1": lambda r, m: r.index_select(0, m.reshape(-1)).view(m.shape[0], m.shape[1], -1).sum(1) * 1.0,
}.items():
    el._sum_rows = fn
    try:
        run_expert(name)
    except Exception as e:  # noqa: BLE001
        print(f"expert layer, {name:28s} raised {type(e).__name__}: {str(e)[:200]}")
