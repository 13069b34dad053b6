import torch

import fuseops
from fuseops import ops

torch.manual_seed(0)
E, H, I = 4, 32, 48
def experts_ref(m, x, sizes):
    out = []
    start = 0
    w1, w2 = m[0].weight.double(), m[2].weight.double()
    for e, n in enumerate(sizes):
        xe = x[start:start + n].double()
        z = xe @ w1[e].t()
        a, b = z.chunk(2, -1)
        h = torch.nn.functional.silu(a) * b
        out.append(h @ w2[e].t())
        start += n
    return torch.cat(out)
def check(name, got, want, tol=1e-4):
    err = ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-12)).item() if want.numel() else 0.0
    print(f"{name}: rel err {err:.2e} {'OK' if err < tol else 'BAD'}")
m = fuseops.Sequential(ops.GroupedLinear(E, H, 2 * I), ops.SwiGLU(), ops.GroupedLinear(E, I, H))
for sizes in ([4, 0, 7, 5], [0, 0, 0, 16], [0, 0, 0, 0], [3, 3, 3, 3], [10, 1, 0, 5]):
    x = torch.randn(sum(sizes), H)
    for kind in ("list", "cpu", "tensor64"):
        s = sizes if kind == "list" else torch.tensor(sizes) if kind == "cpu" else torch.tensor(sizes, dtype=torch.int64)
        y = m(x, s, s)
        check(f"sizes {sizes} {kind}", y, experts_ref(m, x, sizes))
# bad sizes
for bad in ([4, 0, 7], [4, 0, 7, 6], [-1, 1, 8, 8]):
    try:
        m(torch.randn(16, H), bad, bad); print("no error for", bad, "BAD")
    except (ValueError, TypeError) as e:
        print("error for", bad, type(e).__name__, str(e)[:120])
# autocast with float32 weights, bf16 compute, backward
x = torch.randn(16, H, requires_grad=True)
sizes = [4, 0, 7, 5]
with torch.autocast("cpu", dtype=torch.bfloat16):
    y = m(x, sizes, sizes)
print("autocast y dtype", y.dtype)
y.float().sum().backward()
print("weight grad dtype", m[0].weight.grad.dtype, "x grad", x.grad.dtype)
check("autocast fwd", y.float(), experts_ref(m, x.detach(), sizes), 3e-2)
# compile fullgraph two shapes with device tensor sizes
m.zero_grad(set_to_none=True)
cm = torch.compile(m, fullgraph=True, backend="aot_eager")
for sizes in ([4, 0, 7, 5], [8, 8, 1, 3], [2, 2, 2, 2]):
    x = torch.randn(sum(sizes), H, requires_grad=True)
    s = torch.tensor(sizes)
    y = cm(x, s, s)
    check(f"compiled {sizes}", y, experts_ref(m, x.detach(), sizes))
    y.sum().backward()
# expert_layer with routing, NaN in a token
T, K = 12, 2
x = torch.randn(T, H, requires_grad=True)
ids = torch.stack([torch.randperm(E)[:K] for _ in range(T)])
w = torch.softmax(torch.randn(T, K), -1)
y = fuseops.moe.expert_layer(x, ids, w, m)
xs = x.detach().clone(); xs[5, 3] = float("inf")
y2 = fuseops.moe.expert_layer(xs, ids, w, m)
print("inf token row 5 non-finite:", (~torch.isfinite(y2[5])).any().item(), "others finite:", torch.isfinite(torch.cat([y2[:5], y2[6:]])).all().item())
# compare expert_layer against reference
ref = torch.zeros(T, H, dtype=torch.float64)
for t in range(T):
    for k in range(K):
        e = ids[t, k].item()
        z = x[t].double() @ m[0].weight[e].double().t()
        a, b = z.chunk(2, -1)
        ref[t] += w[t, k].double() * ((torch.nn.functional.silu(a) * b) @ m[2].weight[e].double().t())
check("expert_layer", y, ref)
y.sum().backward()
print("expert_layer grads", x.grad.shape, m[0].weight.grad.shape)
