"""Session 30 (no device time): the compiled MoE composition on the CPU (E=16 H=256 F=128 top-4
T=512, float32 parameters, one thread), its routing as the routed operators against the routing
kernels' operators (the code before session 30: ``compiled_routing_ab.routing``), in one process,
rounds interleaved in alternating order; plain and under ``torch.autocast(cpu, bfloat16)``.
Prints (min, median) ms a forward+backward step.

    PYTHONPATH=. python3 benchmarks/results/session30/cpu_routing_ab.py [autocast]
"""
import statistics
import sys
import time

import torch

from benchmarks import sizes
from benchmarks.results.session30.compiled_routing_ab import variant

torch.set_num_threads(1)
autocast = "autocast" in sys.argv
E, H, F, K, T = 16, 256, 128, 4, 512
torch.manual_seed(0)
model = sizes.FuseopsMoE(E, H, F)
args = sizes.moe_args(T, E, H, K, device="cpu", dtype=torch.float32)
params = list(model.parameters())
steps = {}
for old in (False, True):
    inner = variant(sizes.step_fn(torch.compile(model), args, params), old)

    def run(inner=inner):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            inner()
    steps["kernel ops (before)" if old else "routing ops (new)"] = run
for step in steps.values():
    for _ in range(5):
        step()
times: dict[str, list[float]] = {name: [] for name in steps}
for r in range(6):
    for name, step in (steps.items() if r % 2 == 0 else reversed(steps.items())):
        per_step = []
        for _ in range(30):
            start = time.perf_counter()
            step()
            per_step.append(time.perf_counter() - start)
        times[name].append(statistics.median(per_step) * 1e3)
print(f"{'autocast' if autocast else 'plain'}: " + ", ".join(
    f"{name} {min(v):.2f} / {statistics.median(v):.2f}" for name, v in times.items()))
