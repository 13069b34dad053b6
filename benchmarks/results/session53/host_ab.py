"""Session 53 probe (issue 20): the host-path trims' effect on host time alone, paired step by step. Each iteration
drains the device, queues a ~20 ms GPU spin (``torch.cuda._sleep``) so that no step waits on the GPU, then issues one
step with the trims on and one with them off (``ab_trims.trims``; the order alternates) and times each step's host
wall time. Medians of each and of the paired off/on ratio, eager and (``--compiled``) under torch.compile.

    python benchmarks/results/session53/host_ab.py [--cells gelu:1024:2048 swiglu:1024:2048] [--pairs 100]
"""
import argparse
import statistics
import time

import torch

from benchmarks.results.session53.ab_trims import trims
from benchmarks.sizes import dense_cell, step_fn


def paired(step, pairs: int) -> tuple[float, float, float]:
    """Median host ms on, off, and the median off/on ratio of ``pairs`` paired steps."""
    on, off, ratios = [], [], []
    for i in range(pairs):
        torch.cuda.synchronize()
        torch.cuda._sleep(30_000_000)
        got = {}
        for flag in ((True, False) if i % 2 == 0 else (False, True)):
            trims(flag)
            start = time.perf_counter()
            step()
            got[flag] = (time.perf_counter() - start) * 1e3
        on.append(got[True])
        off.append(got[False])
        ratios.append(got[False] / got[True])
    trims(True)
    torch.cuda.synchronize()
    return statistics.median(on), statistics.median(off), statistics.median(ratios)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:1024:2048", "swiglu:1024:2048"])
    p.add_argument("--pairs", type=int, default=100)
    p.add_argument("--compiled", action="store_true")
    a = p.parse_args()
    for cell in a.cells:
        model, _, x = dense_cell(cell)
        variants = {"eager": step_fn(model, (x,), list(model.parameters()))}
        if a.compiled:
            variants["compiled"] = step_fn(torch.compile(model), (x,), list(model.parameters()))
        for name, step in variants.items():
            for flag in (True, False) * 20:
                trims(flag)
                step()
            on, off, ratio = paired(step, a.pairs)
            print(f"{cell:16} {name:8} host ms on {on:5.3f}  off {off:5.3f}  off/on paired median {ratio:5.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
