"""Session 41 probe (issue 20): why issuing a drained dense step takes longer at GPU-bound sizes, for fuseops and
torch alike (session 40, call 16: fuseops 1.97 -> 3.68 ms from GELU H=1024 to H=4096 at T=16384, torch eager 1.54 ->
2.58, with the same launches a step and no device frees). torch.profiler, CPU activity, over steps each started on a
drained device: per variant the step's issue time, the CPU time of every CUDA runtime / driver call by name, and
the longest single calls (a call that waits on the GPU shows as one long event).

    python benchmarks/results/session41/drained_calls.py [--cells gelu:16384:4096 ...]
"""
import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.sizes import dense_cell, step_fn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:4096", "gelu:16384:1024", "gelu:1024:1024"])
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        for name, m in (("fuseops", model), ("torch", reference)):
            step = step_fn(m, (x,), list(m.parameters()))
            for _ in range(60):
                step()
            torch.cuda.synchronize()
            plain = []
            for _ in range(10):
                torch.cuda.synchronize()
                t = time.perf_counter()
                step()
                plain.append(1e3 * (time.perf_counter() - t))
            torch.cuda.synchronize()
            walls = []
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(a.steps):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    step()
                    walls.append(1e3 * (time.perf_counter() - t))
                torch.cuda.synchronize()
            events = [e for e in prof.events() if e.name.startswith("cu") and "Synchronize" not in e.name]
            by_name = collections.defaultdict(lambda: [0, 0.0])
            for e in events:
                by_name[e.name][0] += 1
                by_name[e.name][1] += e.cpu_time_total
            print(f"\n== {cell} {name}: drained step issue {sorted(plain)[len(plain) // 2]:.2f} ms "
                  f"(profiled {sorted(walls)[len(walls) // 2]:.2f})", flush=True)
            for n, (count, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:8]:
                print(f"   {us / a.steps:9.1f} us a step  {count / a.steps:6.1f} calls  {n}")
            longest = sorted(events, key=lambda e: -e.cpu_time_total)[:8]
            print("   longest calls: " + ", ".join(f"{e.name} {e.cpu_time_total:.0f} us" for e in longest))
            slow = [e for e in events if e.cpu_time_total > 50]
            print(f"   calls over 50 us: {len(slow) / a.steps:.1f} a step, {sum(e.cpu_time_total for e in slow) / a.steps:.0f} us")
            del step
        del model, reference, x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
