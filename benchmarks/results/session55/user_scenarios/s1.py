import copy
import io

import torch

import fuseops
from fuseops import ops

torch.manual_seed(0)
def block(H=32, I=64):
    return fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, I, bias=True), ops.GELU(approximate="tanh"),
                              ops.Linear(I, H, bias=True), ops.AddExtraInput())
def ref_forward(m, x):
    norm, fc1, _, fc2, _ = m
    xd = x.double()
    n = torch.nn.functional.rms_norm(xd, (xd.shape[-1],), norm.weight.double(), norm.eps)
    z = n @ fc1.weight.double().t() + fc1.bias.double()
    h = torch.nn.functional.gelu(z, approximate="tanh")
    return h @ fc2.weight.double().t() + fc2.bias.double() + xd
def check(name, got, want, tol=1e-4):
    err = (got.double() - want).abs().max().item()
    print(f"{name}: max err {err:.2e} {'OK' if err < tol else 'BAD'}")
m = block()
x = torch.randn(16, 32)
for i in range(3):
    check(f"call {i}", m(x, x), ref_forward(m, x))
# 1. replace a parameter after calls
m[1].weight = torch.nn.Parameter(torch.randn_like(m[1].weight))
check("param replaced", m(x, x), ref_forward(m, x))
# 2. in-place under no_grad
with torch.no_grad():
    m[3].weight.mul_(2)
check("in-place weight", m(x, x), ref_forward(m, x))
# 3. change eps
m[0].eps = 0.5
check("eps changed", m(x, x), ref_forward(m, x))
# 4. deepcopy after calls
m2 = copy.deepcopy(m)
with torch.no_grad():
    m2[1].weight.zero_()
check("deepcopy original", m(x, x), ref_forward(m, x))
check("deepcopy copy", m2(x, x), ref_forward(m2, x))
# 5. state dict load
m3 = block(); m3.load_state_dict(m.state_dict())
check("load_state_dict", m3(x, x), ref_forward(m, x))
# 6. pickle after calls
buf = io.BytesIO(); torch.save(m, buf); buf.seek(0)
m4 = torch.load(buf, weights_only=False)
check("torch.save/load", m4(x, x), ref_forward(m, x))
# 7. to(float64) after calls
m5 = copy.deepcopy(m).double()
check("double()", m5(x.double(), x.double()), ref_forward(m, x), 1e-10)
# 8. different row count, 3-D input
x3 = torch.randn(2, 5, 32)
check("3-D input", m(x3, x3), ref_forward(m, x3))
# 9. zero rows
x0 = torch.randn(0, 32, requires_grad=True)
y0 = m(x0, x0); y0.sum().backward(); print("zero rows", y0.shape, x0.grad.shape)
# 10. grads vs reference
xg = torch.randn(8, 32, dtype=torch.float64)
params = list(m.parameters())
x1 = xg.float().requires_grad_()
m(x1, x1).pow(2).sum().backward()
got = [p.grad.clone() for p in params] + [x1.grad.clone()]
for p in params: p.grad = None
x2 = xg.clone().requires_grad_()
pd = [p.detach().double().requires_grad_() for p in params]
# build reference with double params
norm_w, b1w, b1b, b2w, b2b = pd
n = torch.nn.functional.rms_norm(x2, (32,), norm_w, m[0].eps)
z = n @ b1w.t() + b1b
h = torch.nn.functional.gelu(z, approximate="tanh")
yd = h @ b2w.t() + b2b + x2
yd.pow(2).sum().backward()
want = [q.grad for q in pd] + [x2.grad]
for i, (g, w) in enumerate(zip(got, want)):
    err = ((g.double() - w).abs().max() / w.abs().max().clamp_min(1e-12)).item()
    print(f"grad {i} rel err {err:.2e} {'OK' if err < 1e-4 else 'BAD'}")
# 11. NaN in input propagates
xn = x.clone(); xn[3, 4] = float("nan")
y = m(xn, xn); print("NaN row 3 nan:", torch.isnan(y[3]).all().item(), "other rows finite:", torch.isfinite(y[[0,1,2,4]]).all().item())
# 12. requires_grad_(False) on a weight after calls
m[1].weight.requires_grad_(False)
xr = torch.randn(8, 32, requires_grad=True)
m(xr, xr).sum().backward()
print("frozen weight grad is None:", m[1].weight.grad is None, "bias grad:", m[1].bias.grad is not None)
# 13. forward hook on an op after calls
seen = []
h = m[2].register_forward_hook(lambda mod, i, o: seen.append(o.shape))
m(x, x); h.remove(); print("hook fired:", seen)
check("after hook removed", m(x, x), ref_forward(m, x))
check("load_state_dict vs own ref", m3(x, x), ref_forward(m3, x))
