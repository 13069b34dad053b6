"""Session 25: the two host-bound dense cells still under 1.2x (gelu T=4096 H=1024, gelu T=1024 H=2048):
which programs stay eager by the GPU-bound rule, and the synced step (as sizes.py times it) with
GPU_BOUND 2.0 against 4.0 and infinity (every program graphed), torch eager beside; interleaved
rounds in one process, each variant's fastest median."""
import gc

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed


def programs():
    return {id(g): g for g in gc.get_objects() if isinstance(g, graphed.GraphedProgram)}


def states(before):
    out = []
    for key, g in programs().items():
        if key not in before:
            out.append(f"{g.phase}:{'/'.join(f'{round(h * 1e6)}-{round(s * 1e6)}' for h, s in g.eager_samples)}")
    return out


torch.manual_seed(0)
for act, T, H in (("gelu", 4096, 1024), ("gelu", 1024, 2048)):
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    variants = {}
    for bound in (2.0, 4.0, float("inf")):
        graphed.GPU_BOUND = bound
        before = programs()
        m = sizes.fuseops_dense(H, act).cuda().bfloat16()
        step = sizes.step_fn(m, (x,), list(m.parameters()))
        for _ in range(40):
            step()
        torch.cuda.synchronize()
        print(f"{act} T={T} H={H} GPU_BOUND={bound}: programs (phase: eager host-span us)", states(before))
        variants[f"bound {bound}"] = step
        gc.collect()
    tm = sizes.torch_dense(m).cuda().bfloat16()
    variants["torch"] = sizes.step_fn(tm, (x,), list(tm.parameters()))
    best = {}
    for _ in range(3):
        for name, step in variants.items():
            ms, enq = sizes.time_ms(step, "cuda", 20), sizes.enqueue_ms(step, "cuda", 20)
            best[name] = min(best.get(name, (ms, enq)), (ms, enq))
    t = best["torch"][0]
    print("  " + ", ".join(f"{k} {v[0]:.2f} ms (enq {v[1]:.2f}, x torch {t / v[0]:.2f})" for k, v in best.items()))
print(graphed.counts)
