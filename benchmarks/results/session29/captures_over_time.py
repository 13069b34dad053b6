"""Session 29: do the graph states of an MoE step keep capturing in steady state at Qwen3 T=32768
(call 1's profile saw captures during its five profiled steps, after 10 s of warm-up)? Without the
profiler: per block of 25 steps, the step time and what the graph states did."""
import time

import torch

from benchmarks.moe_layer import SHAPES, forward_backward, implementations, make_case, set_grads_to_none
from fuseops.ops.executor import graphed

case = make_case(**SHAPES["qwen3-30b-a3b"])
impls = implementations(case, ["fuseops composed", "fuseops fp8"])
for name in ("fuseops composed", "fuseops fp8"):
    step = forward_backward(case, impls[name])
    for block in range(8):
        before = dict(graphed.counts)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(25):
            set_grads_to_none(case)
            step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / 25
        changed = {k: v - before[k] for k, v in graphed.counts.items() if v != before[k]}
        print(f"{name:17s} steps {block * 25:3d}-{block * 25 + 24:3d}: {ms:6.2f} ms/step, graph states {changed}",
              flush=True)
