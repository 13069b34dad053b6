"""Session 40 probe (issue 20): where the host time of a drained GPU-bound dense step goes. Call 7: issuing one
step of GELU T=4096 H=4096 took fuseops 3.21 ms against torch eager's 2.40 (1.17 / 1.64 at H=2048 T=1024), with no
device frees in either. torch.profiler, CPU activity, over steps each started on a drained device; the runtime
calls and ops with the most self CPU time, fuseops eager against torch eager, and the step's wall time.

    python benchmarks/results/session40/drained_host.py [--cells gelu:4096:4096 ...]
"""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.sizes import dense_cell, step_fn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:4096:4096", "gelu:1024:1024"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=14)
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        for name, m in (("fuseops", model), ("torch", reference)):
            step = step_fn(m, (x,), list(m.parameters()))
            for _ in range(60):
                step()
            walls = []
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(a.steps):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    step()
                    walls.append(1e3 * (time.perf_counter() - t))
            torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top, max_name_column_width=60)
            print(f"\n== {cell} {name}: drained step issue {sorted(walls)[len(walls) // 2]:.2f} ms (profiled)")
            print("\n".join(line[:150] for line in table.splitlines()))


if __name__ == "__main__":
    main()
