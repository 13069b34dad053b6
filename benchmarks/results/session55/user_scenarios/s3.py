import copy

import torch

import fuseops
from fuseops import ops

torch.manual_seed(0)
H, I = 32, 64
def make():
    torch.manual_seed(1)
    return torch.nn.Sequential(*[fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, 2 * I), ops.SwiGLU(), ops.Linear(I, H))
                                 for _ in range(2)])
def torch_make(fm):
    layers = []
    for b in fm:
        layers += [torch.nn.RMSNorm(H, eps=b[0].eps), torch.nn.Linear(H, 2 * I), "swiglu", torch.nn.Linear(I, H)]
    class M(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.mods = torch.nn.ModuleList([l for l in layers if l != "swiglu"])
        def forward(s, x):
            for i in range(0, len(s.mods), 3):
                n, f1, f2 = s.mods[i:i + 3]
                a, b = f1(n(x)).chunk(2, -1)
                x = f2(torch.nn.functional.silu(a) * b)
            return x
    m = M().double()
    with torch.no_grad():
        src = [p for p in fm.parameters()]
        for p, q in zip(m.parameters(), src): p.copy_(q.double())
    return m
def train(model, steps, shapes, compile_=False, autocast=False, dtype=torch.float32):
    model = copy.deepcopy(model)
    fn = torch.compile(model, fullgraph=True) if compile_ else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    g = torch.Generator().manual_seed(3)
    for s in range(steps):
        x = torch.randn(shapes[s % len(shapes)], H, generator=g, dtype=torch.float64)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = fn(x.to(dtype))
            loss = y.float().pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        losses.append(loss.item())
    return losses, model
fm = make()
ref_losses, ref_model = train(torch_make(fm), 6, [16, 24, 8], dtype=torch.float64)
eager, em = train(fm, 6, [16, 24, 8])
comp, cmod = train(fm, 6, [16, 24, 8], compile_=True)
auto, _ = train(fm, 6, [16, 24, 8], autocast=True)
auto_c, _ = train(fm, 6, [16, 24, 8], compile_=True, autocast=True)
print("ref   ", [f"{l:.6f}" for l in ref_losses])
print("eager ", [f"{l:.6f}" for l in eager])
print("comp  ", [f"{l:.6f}" for l in comp])
print("auto  ", [f"{l:.6f}" for l in auto])
print("auto_c", [f"{l:.6f}" for l in auto_c])
pe = torch.cat([p.detach().flatten() for p in em.parameters()])
pc = torch.cat([p.detach().flatten() for p in cmod.parameters()])
pr = torch.cat([p.detach().flatten() for p in ref_model.parameters()])
print("eager vs ref params", (pe.double() - pr).abs().max().item(), "compiled vs eager", (pc - pe).abs().max().item())
