"""Session 52 probe (issue 20): where a compiled fuseops dense step loses to fuseops eager on the GPU (session 51:
GELU T=1024 H=4096 6.25 against 5.42 ms with the same kernels, run 1), without a profiler (CUPTI slows every
CUDA-graph launch: run 2). Per drained step, host times at the step's start, after the forward and after the
backward call returns (perf_counter), and CUDA events recorded at the same three points; medians of: the host's
forward and backward, the GPU's time to reach each event from the start event, the wall. A GPU event later than
its host point by much more than the GPU's own work means the host waited there, earlier by little, the GPU idled.
Then a few steps under ``torch.cuda.set_sync_debug_mode("error")``: a host synchronisation inside a step raises.

    python benchmarks/results/session52/phases.py [--cells gelu:1024:4096 gelu:1024:1024]
"""
import argparse
import statistics
import time

import torch

from benchmarks.sizes import dense_cell


def phases(model, x, params, warmup: int, steps: int) -> dict[str, float]:
    def step(marks):
        for p in params:
            p.grad = None
        marks.append((time.perf_counter(), torch.cuda.Event(enable_timing=True)))
        marks[-1][1].record()
        y = model(x)
        marks.append((time.perf_counter(), torch.cuda.Event(enable_timing=True)))
        marks[-1][1].record()
        y.sum().backward()
        marks.append((time.perf_counter(), torch.cuda.Event(enable_timing=True)))
        marks[-1][1].record()
    for _ in range(warmup):
        step([])
    torch.cuda.synchronize()
    rows = []
    for _ in range(steps):
        marks = []
        start = time.perf_counter()
        step(marks)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3
        (h0, e0), (h1, e1), (h2, e2) = marks
        rows.append({"host_fwd": (h1 - h0) * 1e3, "host_bwd": (h2 - h1) * 1e3, "gpu_fwd": e0.elapsed_time(e1),
                     "gpu_bwd": e1.elapsed_time(e2), "wall": wall})
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def syncs(model, x, params) -> str:
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            for p in params:
                p.grad = None
            model(x).sum().backward()
        return "no host synchronisation"
    except RuntimeError as e:
        return f"synchronises: {str(e)[:200]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:1024:4096", "gelu:1024:1024"])
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        for name, m, params in (("fuseops", model, list(model.parameters())),
                                ("fuseops compiled", torch.compile(model), list(model.parameters())),
                                ("torch", reference, list(reference.parameters())),
                                ("torch.compile", torch.compile(reference), list(reference.parameters()))):
            r = phases(m, x, params, a.warmup, a.steps)
            print(f"{cell:16} {name:17} wall {r['wall']:6.2f} ms | host fwd {r['host_fwd']:5.2f} bwd "
                  f"{r['host_bwd']:5.2f} | GPU at fwd end {r['gpu_fwd']:5.2f} bwd {r['gpu_bwd']:5.2f} | "
                  f"{syncs(m, x, params)}", flush=True)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
