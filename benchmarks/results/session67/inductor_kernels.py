"""Session 67 probe (issue 20, compiled >= torch.compile at GPU-bound cells): the device kernels of one settled
fuseops step (eager; compiled fuseops runs the same kernels within 2 %, session 66 call 2) and one torch.compile
step of the same torch.nn model, each summed by name over ``--steps`` profiled steps and listed longest first, so
the GEMMs and elementwise kernels of the two can be set side by side (session 67 call 2: at gelu T=16384 H=2048
fuseops' GPU busy time 21.02 ms a step against torch.compile's 20.45).

    python benchmarks/results/session67/inductor_kernels.py --cells gelu:16384:2048
    python benchmarks/results/session67/inductor_kernels.py --device cpu --cells gelu:64:32   # the script itself
"""
import argparse

import torch

from benchmarks._timing import graph_settle_steps
from benchmarks.results.session65.compiled_kernels import kernels_per_step as session65_kernels_per_step
from benchmarks.sizes import dense_cell, step_fn


def kernels_per_step(step, steps: int, device: str) -> dict[str, tuple[float, float]]:
    """{kernel name: (us a step, launches a step)} of ``steps`` profiled steps (session 65's
    ``kernels_per_step``), after the graph states settle."""
    graph_settle_steps(step, torch.cuda.synchronize if device == "cuda" else (lambda: None), 100)
    return session65_kernels_per_step(step, steps, device)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:2048"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    for cell in a.cells:
        model, reference, x = dense_cell(cell, a.device, dtype)
        for name, module in (("fuseops", model), ("torch.compile", torch.compile(reference))):
            kernels = kernels_per_step(step_fn(module, (x,), list(module.parameters())), a.steps, a.device)
            print(f"\n{cell} {name}: total {sum(t for t, _ in kernels.values()):9.1f} us a step "
                  f"({sum(n for _, n in kernels.values()):.1f} launches)")
            for k, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:a.top]:
                print(f"  {t:9.1f} ({n:4.1f}) {t / max(n, 1e-9):8.1f}  {k[:120]}")


if __name__ == "__main__":
    main()
