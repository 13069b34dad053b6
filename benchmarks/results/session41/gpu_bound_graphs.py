"""Session 41 probe (issue 20's host target at GPU-bound cells): what graphing every recorded program would cost
and save where the decision keeps them eager today (``graphed.GPU_BOUND``: GPU span over 4x the shortest enqueue).
Call 2's profile (GELU T=16384 H=4096, drained): the eight eager replays took 1.9 ms of a fuseops step's host time
against 0.43 ms graphed at T=1024 H=1024. Per cell and variant (today's rule; ``GPU_BOUND`` = inf), a fresh model:
the drained issue time, the synchronised step, and the device memory: reserved after the warm-up and ``empty_cache`` (the graphs'
private pools stay reserved), peak reserved over the steady steps, against the eager variant's, and the bytes of
the graphs' results. Call 3 ran it without the ``empty_cache``; call 5 with it.

    python benchmarks/results/session41/gpu_bound_graphs.py [--cells gelu:16384:4096 moe:qwen3:16384 ...]

Cells "act:T:H" are the dense stack's; "moe:SHAPE:T" ``fuseops.moe.expert_layer`` at ``benchmarks.sizes``' shape
(uniform routing; call 6).
"""
import argparse
import gc
import time

import torch

from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, dense_cell, moe_args, step_fn
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graphed


def median(xs):
    return sorted(xs)[len(xs) // 2]


def run(cell: str, bound: float, steps: int) -> dict:
    graphed.GPU_BOUND = bound
    if cell.startswith("moe:"):
        # "moe:SHAPE:T": fuseops.moe.expert_layer at that shape, uniform routing.
        _, shape, T = cell.split(":")
        E, H, I, K = MOE_SHAPES[shape]
        torch.manual_seed(0)
        model = FuseopsExpertLayer(FuseopsMoE(E, H, I).to("cuda", torch.bfloat16))
        args = moe_args(int(T), E, H, K, False, "cuda", torch.bfloat16)
        x = args[0]
        step = step_fn(model, args, list(model.parameters()))
    else:
        model, _, x = dense_cell(cell)
        step = step_fn(model, (x,), list(model.parameters()))
    before = dict(graphed.counts)
    for _ in range(40):
        step()
    torch.cuda.synchronize()
    # Cached blocks of the general pool that the warm-up's captures left (reusable by any op) go
    # back; the graphs' private pools stay.
    torch.cuda.empty_cache()
    settled = torch.cuda.memory_reserved() / 2**20
    torch.cuda.reset_peak_memory_stats()
    issue, total = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        issue.append(1e3 * (time.perf_counter() - t))
        torch.cuda.synchronize()
        total.append(1e3 * (time.perf_counter() - t))
    row = {"issue_ms": median(issue), "step_ms": median(total),
           "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20, "settled_reserved_mb": settled,
           "peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
           "graph_results_mb": (graphed.held_bytes() + routing_graphs._held()) / 2**20,
           "counts": {k: v - before.get(k, 0) for k, v in graphed.counts.items() if v != before.get(k, 0)}}
    del step, model, x
    graphed.free()
    routing_graphs.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:4096", "gelu:4096:4096", "swiglu:16384:2048",
                                                  "gelu:16384:1024", "swiglu:4096:2048"])
    p.add_argument("--steps", type=int, default=15)
    a = p.parse_args()
    default = graphed.GPU_BOUND
    for cell in a.cells:
        rows = {name: run(cell, bound, a.steps) for name, bound in (("today", default), ("all", float("inf")))}
        t, g = rows["today"], rows["all"]
        print(f"{cell:18s} issue {t['issue_ms']:.2f} -> {g['issue_ms']:.2f} ms  step {t['step_ms']:.2f} -> "
              f"{g['step_ms']:.2f} ms  peak reserved {t['peak_reserved_mb']:.0f} -> {g['peak_reserved_mb']:.0f} MB "
              f"(after empty_cache {t['settled_reserved_mb']:.0f} -> {g['settled_reserved_mb']:.0f}) "
              f"(allocated {t['peak_allocated_mb']:.0f} -> {g['peak_allocated_mb']:.0f}; graph results "
              f"{t['graph_results_mb']:.0f} -> {g['graph_results_mb']:.0f})", flush=True)
        print(f"    counts today {t['counts']}\n    counts all   {g['counts']}", flush=True)


if __name__ == "__main__":
    main()
