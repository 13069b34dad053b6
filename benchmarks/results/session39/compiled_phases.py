"""Session 39 probe (issue 20): a compiled fuseops step's host time beside its eager step's, split into what runs
inside fuseops' bodies (eager: forward_body / backward_body; compiled: the operators' _forward_results /
_gradients, which call them) and the rest (torch.compile's wrappers, autograd); then the synchronised step's median and the CUDA-graph
states' decisions while it was timed. The device is drained before each
step; medians over --reps steps after --warmup.

    python benchmarks/results/session39/compiled_phases.py [--cells gelu:4096:1024 ...]
"""
import argparse
import functools
import statistics
import time

import torch

import fuseops.compiled_sequential as cs
from benchmarks._timing import step_phases
from benchmarks.sizes import dense_cell, step_fn, time_ms
from fuseops.ops.executor import function as fn
from fuseops.ops.executor import graphed

acc: dict[str, float] = {}


def timed(mod, name):
    f = getattr(mod, name)

    @functools.wraps(f)
    def wrapper(*a, **k):
        s = time.perf_counter()
        r = f(*a, **k)
        acc[name] = acc.get(name, 0.0) + time.perf_counter() - s
        return r
    setattr(mod, name, wrapper)


for module, name in ((cs, "_forward_results"), (cs, "_gradients"), (fn, "forward_body"), (fn, "backward_body")):
    timed(module, name)


def phases(step, device, warmup, reps):
    for _ in range(warmup):
        step()
    totals, parts = [], {}
    for _ in range(reps):
        torch.cuda.synchronize() if device == "cuda" else None
        acc.clear()
        s = time.perf_counter()
        step()
        totals.append((time.perf_counter() - s) * 1e3)
        for k, v in acc.items():
            parts.setdefault(k, []).append(v * 1e3)
    torch.cuda.synchronize() if device == "cuda" else None
    before = dict(graphed.counts)
    step_ms = time_ms(step, device, reps)
    graphs = {k: graphed.counts[k] - v for k, v in before.items() if graphed.counts[k] != v}
    return step_ms, statistics.median(totals), {k: round(statistics.median(v), 3) for k, v in parts.items()}, graphs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:4096:1024", "gelu:1024:1024", "swiglu:1024:1024"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--reps", type=int, default=40)
    a = p.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    for cell in a.cells:
        model, reference, x = dense_cell(cell, a.device, dtype)
        params = list(model.parameters())
        compiled, compiled_reference = torch.compile(model), torch.compile(reference)
        tparams = list(reference.parameters())
        for name, m, ps in (("eager", model, params), ("compiled", compiled, params),
                            ("torch eager", reference, tparams), ("torch.compile", compiled_reference, tparams)):
            step_ms, total, parts, graphs = phases(step_fn(m, (x,), ps), a.device, a.warmup, a.reps)
            print(f"{cell:18s} {name:14s} step {step_ms:7.3f} ms enqueue {total:7.3f} ms  {parts} {graphs}", flush=True)
            if a.device == "cuda":
                print(f"{'':33s} {step_phases(m, (x,), ps)}", flush=True)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
