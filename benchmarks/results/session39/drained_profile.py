"""Session 39 probe (issue 20): cProfile of a dense-stack step's host path with the device drained before each
step (only the step itself profiled), fuseops eager and compiled: what the host does outside the executor's
bodies (benchmarks.host_profile profiles back-to-back steps, where a full launch queue blocks anywhere).

    python benchmarks/results/session39/drained_profile.py [--cell gelu:1024:2048] [--top 40]
"""
import argparse
import cProfile

import torch

from benchmarks._timing import profile_table
from benchmarks.sizes import dense_cell, step_fn

p = argparse.ArgumentParser()
p.add_argument("--cell", default="gelu:1024:2048")
p.add_argument("--warmup", type=int, default=40)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--top", type=int, default=40)
p.add_argument("--device", default="cuda")
a = p.parse_args()
model, reference, x = dense_cell(a.cell, a.device, torch.bfloat16 if a.device == "cuda" else torch.float32)
sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
for name, step in (("fuseops eager", step_fn(model, (x,), list(model.parameters()))),
                   ("fuseops compiled", step_fn(torch.compile(model), (x,), list(model.parameters()))),
                   ("torch eager", step_fn(reference, (x,), list(reference.parameters())))):
    for _ in range(a.warmup):
        step()
    prof = cProfile.Profile()
    for _ in range(a.steps):
        sync()
        prof.enable()
        step()
        prof.disable()
    sync()
    print(f"\n==== {name}: {a.cell}, {a.steps} drained steps")
    for key in ("tottime", "cumulative"):
        print(profile_table(prof, key, a.top))
