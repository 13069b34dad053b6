"""Session 25: the CUDA kernels per fwd+bwd step of dense cells below target after the graphs
settled (run with FUSEOPS_CUDA_GRAPHS=0: the same kernels, none inside a graph), fuseops against
torch eager and torch.compile of the same model, summed by kernel name (``torch.profiler``).
Session 23's kernel_profile.py (its ``kernel_us``), with torch eager added.

    FUSEOPS_CUDA_GRAPHS=0 python benchmarks/results/session25/kernel_profile.py --cells gelu:4096:1024
"""
import argparse

import torch

from benchmarks import sizes
from benchmarks.results.session23.kernel_profile import kernel_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="*", default=["gelu:4096:1024"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=14)
    a = ap.parse_args()
    for cell in a.cells:
        m, ref, x = sizes.dense_cell(cell)
        for name, model in (("fuseops", m), ("torch", ref), ("torch.compile", torch.compile(ref))):
            table = kernel_us(sizes.step_fn(model, (x,), list(model.parameters())), a.steps)
            total = sum(v[0] for v in table.values())
            launches = sum(v[1] for v in table.values()) // a.steps
            print(f"== {cell} {name}: {total / 1e3:.2f} ms of kernels a step ({launches} launches)")
            for k, (us, n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:a.top]:
                print(f"  {us:9.1f} us {n // a.steps:3d}x  {k[:110]}")


if __name__ == "__main__":
    main()
