"""Session 40 probe (issue 20): how a compiled fuseops step uses the executor's CUDA graphs against an eager one.
Call 8: issuing a compiled dense step with the device drained took 0.5-1.4 ms more than an eager one (SwiGLU H=2048
T=1024 2.59 against 1.53 ms; its kernels 0.99 ms either way). Per cell and variant, after warm-up: the step's
median with the device drained (host) and synchronised (step), and ``graphed.counts``' changes over the measured
steps, per step. The eager and compiled variants each get a model of their own (the same seed).

    python benchmarks/results/session40/compiled_graphs.py [--cells swiglu:2048:1024 ...]
"""
import argparse
import time

import torch

from benchmarks.sizes import dense_cell, step_fn
from fuseops.ops.executor import graphed


def median_ms(step, steps: int, drained: bool) -> float:
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if not drained:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 1e3 * sorted(times)[steps // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["swiglu:2048:1024", "gelu:1024:4096", "gelu:4096:4096",
                                                   "gelu:1024:16384"])
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    for cell in a.cells:
        for name in ("eager", "compiled"):
            model, _, x = dense_cell(cell)
            run = torch.compile(model) if name == "compiled" else model
            step = step_fn(run, (x,), list(model.parameters()))
            for _ in range(a.warmup):
                step()
            before = dict(graphed.counts)
            host = median_ms(step, a.steps, drained=True)
            full = median_ms(step, a.steps, drained=False)
            per = {k: round((v - before[k]) / (2 * a.steps), 2) for k, v in graphed.counts.items() if v != before[k]}
            print(f"{cell:18s} {name:8s} host {host:6.2f} ms  step {full:6.2f} ms  graph counts a step {per}", flush=True)
            del model, run, step, x
            torch._dynamo.reset()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
