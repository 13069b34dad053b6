"""Session 46 probe (issue 20's host targets at GPU-bound cells and the MoE layer at T >= 4096): the graphs of
GPU-bound programs too, in one shared pool per device (``fuseops/ops/executor/graph_pool.py``), against today's
rule (GPU-bound programs eager; ``today_private``: today's rule in private pools, as before session 46) and
against every program graphed in private pools (session 41: 32-44 % less
host time, 1.7x the peak reserved memory). Per cell and variant, a fresh model: the drained issue time, the
synchronised step, peak reserved and allocated memory over the steady steps, and the graph counts; torch eager's
issue time and step beside.

    python benchmarks/results/session46/shared_pool.py [--cells gelu:16384:4096 moe:qwen3:4096 ...]
"""
import argparse
import gc
import time

import torch

from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, dense_cell, moe_args, step_fn
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graph_pool, graphed


share = graph_pool.can_share


def median(xs):
    return sorted(xs)[len(xs) // 2]


def build(cell: str, torch_model: bool):
    if cell.startswith("moe:"):
        _, shape, T = cell.split(":")
        E, H, I, K = MOE_SHAPES[shape]
        torch.manual_seed(0)
        model = FuseopsExpertLayer(FuseopsMoE(E, H, I).to("cuda", torch.bfloat16))
        args = moe_args(int(T), E, H, K, False, "cuda", torch.bfloat16)
        return step_fn(model, args, list(model.parameters())) if not torch_model else None
    model, reference, x = dense_cell(cell)
    chosen = reference if torch_model else model
    return step_fn(chosen, (x,), list(chosen.parameters()))


def run(cell: str, variant: str, steps: int) -> dict | None:
    graphed.GPU_BOUND = 4.0 if variant.startswith("today") else float("inf")
    private = variant.endswith("_private")
    graph_pool.can_share = (lambda: False) if private else share
    step = build(cell, variant == "torch")
    if step is None:
        return None
    before = dict(graphed.counts)
    for _ in range(40):
        step()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
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
           "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20,
           "peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
           "counts": {k: v - before.get(k, 0) for k, v in graphed.counts.items() if v != before.get(k, 0)}}
    del step
    graphed.free()
    routing_graphs.clear()
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:4096", "gelu:4096:4096", "swiglu:4096:4096",
                                                  "moe:qwen3:4096", "moe:olmoe:16384"])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--variants", nargs="+", default=["torch", "today", "all_private", "all_shared"],
                   help="torch, today (the shared pool), today_private, all_private, all_shared")
    a = p.parse_args()
    print(f"{'cell':18s} {'variant':12s} {'issue ms':>9s} {'step ms':>8s} {'peak res MB':>11s} {'peak alloc MB':>13s}  counts")
    for cell in a.cells:
        for variant in a.variants:
            r = run(cell, variant, a.steps)
            if r is None:
                continue
            counts = {k: v for k, v in r["counts"].items() if k in ("captured", "kept", "clobbered", "recaptured",
                                                                       "stayed_eager", "dropped", "busy")}
            print(f"{cell:18s} {variant:12s} {r['issue_ms']:9.2f} {r['step_ms']:8.2f} {r['peak_reserved_mb']:11.0f} "
                  f"{r['peak_allocated_mb']:13.0f}  {counts}", flush=True)


if __name__ == "__main__":
    main()
