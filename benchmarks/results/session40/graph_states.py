"""Session 40 probe (issue 20): the CUDA-graph state of each recorded program of a dense step where the GPU is the
bound. Call 9: GELU T=4096 H=4096 still captured 0.12 programs a step after 60 warm-up steps (0.1 moves, 0.05 drops);
call 14's profile found those captures' syncs and bitwise checks in a drained step. Per program after each phase:
its phase, captures, eager samples (enqueue ms, GPU span ms) and last graph samples, slots moved / copied.

    python benchmarks/results/session40/graph_states.py [--cells gelu:4096:4096 ...] [--steps 60 60]
"""
import argparse
import weakref

import torch

from benchmarks.sizes import dense_cell, step_fn
from fuseops.ops.executor import graphed

programs: list = []
_init = graphed.GraphedProgram.__init__


def _recording_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    programs.append(weakref.ref(self))


graphed.GraphedProgram.__init__ = _recording_init


def ms(samples):
    return [(round(1e3 * h, 2), round(1e3 * g, 2)) for h, g in samples]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:4096:4096", "swiglu:4096:4096"])
    p.add_argument("--steps", nargs="+", type=int, default=[60, 60])
    a = p.parse_args()
    for cell in a.cells:
        programs.clear()
        model, _, x = dense_cell(cell)
        step = step_fn(model, (x,), list(model.parameters()))
        done = 0
        for n in a.steps:
            before = dict(graphed.counts)
            for _ in range(n):
                step()
            torch.cuda.synchronize()
            done += n
            delta = {k: v - before[k] for k, v in graphed.counts.items() if v != before[k]}
            print(f"\n== {cell} after {done} steps: counts over the last {n} {delta}", flush=True)
            for i, ref in enumerate(programs):
                g = ref()
                if g is None:
                    continue
                print(f"  program {i}: {g.phase:9s} captures {g.captures} eager {ms(g.eager_samples)} graph "
                      f"{ms(g.graph_samples)} moves {g.moves} copied {sorted(g.buffers)} pinned {len(g.pinned)}",
                      flush=True)
        del model, x, step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
