import torch
from torch.utils.checkpoint import checkpoint

import fuseops
from fuseops import ops

torch.manual_seed(0)
H, I = 32, 64
def blk():
    return fuseops.Sequential(ops.LayerNorm(H), ops.Linear(H, I), ops.GELU(), ops.Dropout(0.0), ops.Linear(I, H), ops.AddExtraInput())
m = torch.nn.ModuleList([blk() for _ in range(3)])
def run(x, ckpt, reentrant=False):
    for b in m:
        x = checkpoint(b, x, x, use_reentrant=reentrant) if ckpt else b(x, x)
    return x
def grads(ckpt, reentrant=False):
    for p in m.parameters(): p.grad = None
    x = torch.randn(10, H, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y = run(x, ckpt, reentrant)
    (y.pow(2).sum()).backward()
    return [p.grad.clone() for p in m.parameters()] + [x.grad.clone()], y.detach()
for attempt in range(3):
    g0, y0 = grads(False)
    g1, y1 = grads(True)
    g2, y2 = grads(True, True)
    d1 = max((a - b).abs().max().item() for a, b in zip(g0, g1))
    d2 = max((a - b).abs().max().item() for a, b in zip(g0, g2))
    print(f"attempt {attempt}: checkpoint non-reentrant max grad diff {d1:.2e}, reentrant {d2:.2e}, y diff {(y0-y1).abs().max().item():.1e}")
# full backward hook on a Sequential
seen = []
b = m[0]
h = b.register_full_backward_hook(lambda mod, gi, go: seen.append((gi[0].shape if gi[0] is not None else None, go[0].shape)))
x = torch.randn(4, H, requires_grad=True)
b(x, x).sum().backward(); h.remove()
print("full backward hook", seen)
# double backward: expect clear error or correct
x = torch.randn(4, H, requires_grad=True, dtype=torch.float64)
bd = blk().double()
try:
    y = bd(x, x).pow(2).sum()
    g, = torch.autograd.grad(y, x, create_graph=True)
    g.sum().backward()
    print("double backward ran; x.grad", x.grad.shape)
except Exception as e:  # noqa: BLE001 - a probe: any failure is reported
    print("double backward:", type(e).__name__, str(e)[:150])
# torch.func.grad / vmap
from torch.func import functional_call, grad, vmap

params = dict(bd.named_parameters())
def loss(p, x):
    return functional_call(bd, p, (x, x)).pow(2).sum()
try:
    gp = grad(loss)(params, x.detach())
    y = loss(params, x.detach()); y.backward()
    print("func.grad vs autograd", max((gp[k] - params[k].grad).abs().max().item() for k in gp))
except Exception as e:  # noqa: BLE001 - a probe: any failure is reported
    print("func.grad:", type(e).__name__, str(e)[:200])
try:
    xs = torch.randn(3, 4, H, dtype=torch.float64)
    out = vmap(lambda xx: bd(xx, xx))(xs)
    ref = torch.stack([bd(xx, xx) for xx in xs])
    print("vmap against a loop", (out - ref).abs().max().item())
except Exception as e:  # noqa: BLE001 - a probe: any failure is reported
    print("vmap:", type(e).__name__, str(e)[:200])
