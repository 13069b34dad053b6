"""Session 53 probe (issue 20's MoE host target, <= 0.5 ms a layer fwd+bwd; session 51 measured 0.83-1.11 ms at
T <= 4096): where the host time of one ``fuseops.moe.expert_layer`` step goes. After warm-up (the layer's graphs
decided), the step's phases with the device drained before each (``_timing.step_phases``), the drained enqueue time,
then a cProfile of drained steps (tottime and cumulative).

    python benchmarks/results/session53/moe_host.py [--shape qwen3] [--T 1024] [--skewed] [--top 30]
"""
import argparse
import cProfile

import torch

from benchmarks._timing import profile_table, step_phases
from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, enqueue_ms, moe_args, step_fn
from fuseops.ops.executor import graphed

p = argparse.ArgumentParser()
p.add_argument("--shape", default="qwen3")
p.add_argument("--T", type=int, default=1024)
p.add_argument("--skewed", action="store_true")
p.add_argument("--warmup", type=int, default=40)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--top", type=int, default=30)
a = p.parse_args()
E, H, I, K = MOE_SHAPES[a.shape]
torch.manual_seed(0)
model = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
layer = FuseopsExpertLayer(model)
args = moe_args(a.T, E, H, K, a.skewed)
params = list(model.parameters())  # as sizes.py: x and the weights keep their .grad
step = step_fn(layer, args, params)
for _ in range(a.warmup):
    step()
torch.cuda.synchronize()
print(f"{a.shape} T={a.T} {'skewed' if a.skewed else 'uniform'}: enqueue {enqueue_ms(step, 'cuda', 30):.3f} ms "
      f"(drained), {step_phases(layer, args, params)}", flush=True)
print("graphed counts", dict(graphed.counts), flush=True)
prof = cProfile.Profile()
for _ in range(a.steps):
    torch.cuda.synchronize()
    prof.enable()
    step()
    prof.disable()
torch.cuda.synchronize()
for key in ("tottime", "cumulative"):
    print(profile_table(prof, key, a.top))
