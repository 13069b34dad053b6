"""Step wall time against the GPU's own span and clocks (issue 20: call 7 profiled one GELU T=16384
H=4096 step at 74.7 ms of kernel span for fuseops against 76.8 for torch.compile, yet the timed steps
read 82.2 against 81.2 ms): per variant, 10 synchronised steps with CUDA events around each, the
median wall and event time, and the SM clock and power nvidia-smi reports meanwhile.

    python benchmarks/results/session23/clocks.py [--cell gelu:16384:4096] [--steps 10]
"""
import argparse
import subprocess
import time

import torch

from benchmarks import sizes


def sampled(fn):
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    try:
        out = fn()
    finally:
        smi.terminate()
        lines = smi.communicate()[0].strip().splitlines()
    pairs = [tuple(float(v) for v in line.split(",")) for line in lines if line.count(",") == 1]
    clocks = sorted(p[0] for p in pairs)
    power = sorted(p[1] for p in pairs)
    mid = len(pairs) // 2
    return out, (clocks[mid], clocks[0], power[mid]) if pairs else (0, 0, 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="gelu:16384:4096")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    m, ref, x = sizes.dense_cell(a.cell)
    variants = {"fuseops": m, "torch.compile": torch.compile(ref), "torch eager": ref}
    steps = {k: sizes.step_fn(v, (x,), list(v.parameters())) for k, v in variants.items()}
    for step in steps.values():
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    for rnd in range(2):
        for name, step in steps.items():
            def run(step=step):
                wall, gpu = [], []
                for _ in range(a.steps):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    t0 = time.perf_counter()
                    s.record()
                    step()
                    e.record()
                    torch.cuda.synchronize()
                    wall.append((time.perf_counter() - t0) * 1e3)
                    gpu.append(s.elapsed_time(e))
                return sorted(wall)[len(wall) // 2], sorted(gpu)[len(gpu) // 2]
            (wall, gpu), (clock, low, power) = sampled(run)
            print(f"round {rnd} {name:14s} wall {wall:7.2f} ms  events {gpu:7.2f} ms  SM clock median {clock:.0f} "
                  f"min {low:.0f} MHz  power {power:.0f} W", flush=True)


if __name__ == "__main__":
    main()
