"""Session 38: why fp8_moe's FP8 current row at Mixtral, eight micro-batches, reads 19.5 ms at the default
do_bench repetitions and ~35 ms at --rep 2500 (H100). Every step timed by events, back to back (no sync), with the
weights' magnitude (the benchmark's LR step drifts them: inf by step ~20, NaN after) and Python's gc."""
import gc
import time

import torch

from benchmarks import fp8_moe
from benchmarks.moe_layer import SHAPES, fuseops_layer, make_case, quantized

collections = []
gc.callbacks.append(lambda phase, info: collections.append((phase, info["generation"], time.perf_counter())))
case = make_case(**SHAPES["mixtral-8x7b"])
layer = quantized(fuseops_layer(case), fp8_moe.RECIPES["fp8 current"])
step = fp8_moe.optimizer_step(case, layer, 8)
events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(48)]
host = []
for i, (a, b) in enumerate(events):
    t = time.perf_counter()
    a.record()
    step()
    b.record()
    host.append((time.perf_counter() - t) * 1e3)
torch.cuda.synchronize()
for i, (a, b) in enumerate(events):
    print(f"step {i:2d} gpu {a.elapsed_time(b) / 8:7.2f} ms/mb host {host[i] / 8:7.2f} ms/mb", flush=True)
print("gc generation-2 collections:", sum(1 for p, g, _ in collections if p == "start" and g == 2))
print("w1 finite:", bool(torch.isfinite(case.w1).all()))
