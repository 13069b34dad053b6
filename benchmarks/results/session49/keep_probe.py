"""Session 49 probe: why the keep rule drops GPU-bound graphs under FUSEOPS_CUDA_GRAPHS=all (run 1: the graphs'
GPU spans 3-11 % over the eager programs' at GELU / SwiGLU T=4096 H=4096). For each judgement: the verdict, the
samples (the graph's with the copies' time), the verdict by the graph's own span (the rule before session 49) last
among the eager samples, the graph's copied slots (bytes) and pinned slots, and the copies' share at 3 TB/s.

    python benchmarks/results/session49/keep_probe.py gelu:4096:4096
"""
import sys
import time

import torch

from fuseops.ops.executor import graphed


def main() -> None:
    cell = sys.argv[1] if len(sys.argv) > 1 else "gelu:4096:4096"
    graphed.GPU_BOUND = float("inf")
    sys.argv = sys.argv[:1]
    from benchmarks.results.session46 import shared_pool
    real_judge = graphed.GraphedProgram._judge
    names = {}

    def judge(self):
        before = self.phase
        ready = len(self.timed) >= graphed.MEASURED_CALLS and self.timed[-1].end.query()
        copied = {slot: b.nbytes for slot, b in self.buffers.items()}
        real_judge(self)
        if ready:
            name = names.setdefault(id(self), f"p{len(names)}")
            e = [tuple(round(v * 1e3, 3) for v in sample[:2]) for sample in self.eager_samples]
            s = [tuple(round(v * 1e3, 3) for v in sample) for sample in self.graph_samples]
            if self.eager_samples:  # the verdict by the graph's own span (the rule before session 49)
                e.append(graphed.decision(self.eager_samples, self.graph_samples, same_work=False))
            mb = sum(copied.values()) / 2**20
            print(f"{name} {before}->{self.phase} captures {self.captures} pinned {len(self.pinned)} "
                  f"copied {sorted(copied)} {mb:.0f} MB (~{2 * mb / 2**10 / 3e3 * 1e3:.3f} ms at 3 TB/s) "
                  f"unsettled {sorted(self.unsettled)} eager {e} graph {s}", flush=True)

    graphed.GraphedProgram._judge = judge
    step = shared_pool.build(cell, False)
    counted = dict(graphed.counts)
    for i in range(60):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        t = time.perf_counter() - t
        if i % 10 == 9:
            print(f"step {i}: issue {t * 1e3:.2f} ms, counts "
                  f"{ {k: v - counted.get(k, 0) for k, v in graphed.counts.items() if v != counted.get(k, 0)} }, "
                  f"reserved {torch.cuda.memory_reserved() / 2**20:.0f} MB", flush=True)
            counted = dict(graphed.counts)
    for p in graphed._holding:
        print(names.get(id(p), "?"), p.phase, "copied", sorted(p.buffers), "pinned", len(p.pinned))


if __name__ == "__main__":
    main()
