"""Session 32, CPU (torch references, one thread): expert_layer's quantized Function against the composition
under FP8 current scaling and blockwise, bf16, fwd+bwd; minimum over 7 interleaved rounds of the median of 20 steps."""
import statistics
import time

import torch

import fuseops
from fuseops import ops
from fuseops.moe import expert_layer, permute, unpermute

torch.set_num_threads(1)
def run(E,H,F,K,T, recipe):
    torch.manual_seed(0)
    exp = fuseops.Sequential(ops.GroupedLinear(E,H,2*F), ops.SwiGLU(scaled=True), ops.GroupedLinear(E,F,H)).bfloat16()
    x = torch.randn(T,H).bfloat16().requires_grad_(); ids = torch.randint(0,E,(T,K)); w = torch.rand(T,K, requires_grad=True)
    dy = torch.randn(T,H).bfloat16()
    def layer():
        y = expert_layer(x, ids, w, exp); y.backward(dy)
    def comp():
        xs, s, rm = permute(x, ids, E); p = w.new_empty(rm.numel()).scatter(0, rm.reshape(-1), w.reshape(-1))
        unpermute(exp(xs, s, p, s), rm, None).backward(dy)
    fns = {"layer": layer, "composition": comp}
    times = {k: [] for k in fns}
    with fuseops.autocast(recipe=recipe):
        for f in fns.values():
            for _ in range(5): f()
        for _ in range(7):
            for k, f in fns.items():
                ts=[]
                for _ in range(20):
                    t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
                times[k].append(statistics.median(ts))
    return {k: min(v)*1e3 for k, v in times.items()}
for name, r in (("fp8 current", fuseops.recipes.FP8CurrentScaling()), ("fp8 blockwise", fuseops.recipes.FP8Blockwise())):
    for shape in ((8,64,32,2,64), (16,256,128,4,512)):
        t = run(*shape, r)
        print(name, shape, {k: round(v,2) for k,v in t.items()}, f"layer/composition {t['composition']/t['layer']:.2f}x")
