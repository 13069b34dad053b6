import torch
from torch.utils.checkpoint import checkpoint

import fuseops
from fuseops import ops

H, I = 32, 64
torch.manual_seed(0)
b = fuseops.Sequential(ops.Linear(H, I), ops.GELU(), ops.Dropout(0.5), ops.Linear(I, H))
def grads(ckpt, reentrant):
    for p in b.parameters(): p.grad = None
    torch.manual_seed(123)
    x = torch.randn(16, H, requires_grad=True)
    y = checkpoint(b, x, use_reentrant=reentrant) if ckpt else b(x)
    y.pow(2).sum().backward()
    return [p.grad.clone() for p in b.parameters()] + [x.grad.clone()], y.detach()
for i in range(3):
    g0, y0 = grads(False, False)
    for r in (False, True):
        g1, y1 = grads(True, r)
        print(f"round {i} reentrant={r}: y diff {(y0 - y1).abs().max().item():.1e}, grad diff {max((a - c).abs().max().item() for a, c in zip(g0, g1)):.1e}")
# eval mode: dropout off
b.eval(); x = torch.randn(4, H)
y1, y2 = b(x), b(x)
print("eval deterministic", torch.equal(y1, y2))
b.train()
y1, y2 = b(x), b(x)
print("train differs", not torch.equal(y1, y2))
# fraction zeroed
b2 = fuseops.Sequential(ops.Dropout(0.3))
z = b2(torch.ones(1000, 100))
print("dropout keep fraction", (z != 0).float().mean().item(), "scale", z[z != 0].unique()[:3])
