"""Session 39 probe (issue 20): fuseops eager dense-stack steps with its CUDA graphs of recorded programs on and
off (graphed.ENABLED toggled around each model's steps; two models of the cell), interleaved rounds, at
GPU-bound cells: do the kept graphs cost GPU time there (copied inputs, GPU_SLACK lets a kept graph's span grow
up to 10 %)? Prints each round's median step and the graph states' counts.

    python benchmarks/results/session39/graphs_ab.py [--cells gelu:16384:1024 ...]
"""
import argparse

import torch

from benchmarks.sizes import dense_cell, step_fn, time_ms
from fuseops.ops.executor import graphed

p = argparse.ArgumentParser()
p.add_argument("--cells", nargs="+", default=["gelu:16384:1024", "gelu:4096:4096", "swiglu:4096:4096"])
p.add_argument("--warmup", type=int, default=40)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--rounds", type=int, default=3)
a = p.parse_args()
for cell in a.cells:
    steps = {}
    for on in (True, False):
        model, _, x = dense_cell(cell)
        steps[on] = step_fn(model, (x,), list(model.parameters()))
        graphed.ENABLED = on
        for _ in range(a.warmup):
            steps[on]()
    times = {True: [], False: []}
    before = dict(graphed.counts)
    for _ in range(a.rounds):
        for on in (True, False):
            graphed.ENABLED = on
            times[on].append(time_ms(steps[on], "cuda", a.reps))
    graphed.ENABLED = True
    counts = {k: graphed.counts[k] - v for k, v in before.items() if graphed.counts[k] != v}
    on, off = min(times[True]), min(times[False])
    print(f"{cell:18s} graphs on {on:8.3f} ms  off {off:8.3f} ms  on/off {on / off:.4f}  rounds on {times[True]} "
          f"off {times[False]}  {counts}", flush=True)
    del steps
    torch.cuda.empty_cache()
