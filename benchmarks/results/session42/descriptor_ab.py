"""Session 42 A/B (issue 20): the drained issue time of a dense step with recorded programs passing descriptors
as their kept expansions (``replay._expansions``, "on") against rebuilding descriptor objects every launch
("off", the function patched to None before the model records), beside torch eager; the three variants
interleaved over rounds on one machine, the median step of each round, then the median round.

    python benchmarks/results/session42/descriptor_ab.py [--cells gelu:16384:4096 ...] [--rounds 5]
"""
import argparse
import statistics
import time

import torch

from benchmarks.sizes import dense_cell, step_fn, time_ms
from fuseops.ops.executor import replay


def drained(step, steps: int) -> float:
    walls = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        walls.append(1e3 * (time.perf_counter() - t))
    torch.cuda.synchronize()
    return statistics.median(walls)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:4096", "gelu:4096:4096"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=15)
    a = p.parse_args()
    real = replay._expansions
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        replay._expansions = lambda call, args: None
        off_model, _, _ = dense_cell(cell)
        steps = {"torch": step_fn(reference, (x,), list(reference.parameters())),
                 "off": step_fn(off_model, (x,), list(off_model.parameters()))}
        for _ in range(40):  # records (off) with descriptors rebuilt
            steps["off"]()
        replay._expansions = real
        steps["on"] = step_fn(model, (x,), list(model.parameters()))
        for name in ("on", "torch"):
            for _ in range(40):
                steps[name]()
        rounds = {name: [] for name in steps}
        walls = {name: [] for name in steps}
        for _ in range(a.rounds):
            for name, step in steps.items():
                rounds[name].append(drained(step, a.steps))
                walls[name].append(time_ms(step, "cuda", a.steps))
        med = {name: statistics.median(v) for name, v in rounds.items()}
        print(f"{cell:18s} drained issue ms: torch {med['torch']:.2f}  fuseops off {med['off']:.2f}  "
              f"on {med['on']:.2f}  (on-off {med['on'] - med['off']:+.2f}; rounds on "
              f"{', '.join(f'{v:.2f}' for v in rounds['on'])}; off {', '.join(f'{v:.2f}' for v in rounds['off'])})",
              flush=True)
        print(f"{cell:18s} step ms (fastest round): " + "  ".join(f"{name} {min(v):.2f}" for name, v in walls.items()),
              flush=True)
        del model, off_model, reference, x, steps
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
