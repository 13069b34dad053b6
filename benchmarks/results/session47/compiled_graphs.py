"""Session 47 probe (issue 20): why compiled fuseops ran 7-8 % slower than eager fuseops at GELU / SwiGLU T=16384
H=2048 in call 2 (24.50 / 25.17 ms against 22.68 / 23.20; session 46 call 2: 22.73 / 23.98), where the compiled
variant kept 4 CUDA graphs at a GPU-bound cell and the eager one none. Per cell: each recorded program's graph state
after the warm-up (phase, eager and graph samples as (enqueue ms, GPU span ms), copied slots and their MB, results
copied out), after the row counts ``--through`` ran through the same model (as in the sizes
benchmark), then synchronised steps of eager and compiled fuseops with graph replays on and off
(``graphed.ENABLED``), alternating, in one process.

    python benchmarks/results/session47/compiled_graphs.py [--cells gelu:16384:2048 ...] [--rounds 3]
"""
import argparse

import torch

from benchmarks.results.session40.graph_states import ms, programs  # records every program made
from benchmarks.sizes import dense_cell, step_fn, time_ms
from fuseops.ops.executor import graphed


def states(label: str) -> None:
    print(f"-- {label}: counts {graphed.counts}; programs captured at least once:", flush=True)
    for i, ref in enumerate(programs):
        g = ref()
        if g is None or not g.captures:
            continue
        copied = sum(b.numel() * b.element_size() for b in g.buffers.values()) / 2**20
        print(f"  program {i}: {g.phase:9s} captures {g.captures} eager {ms(g.eager_samples)} graph "
              f"{ms(g.graph_samples)} copied slots {sorted(g.buffers)} ({copied:.0f} MB) copy_out "
              f"{sorted(g.copy_out)} pinned {len(g.pinned)}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:2048", "swiglu:16384:2048"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=20)
    # Row counts run first through the same model, as the sizes benchmark does (rows marked dynamic).
    p.add_argument("--through", nargs="*", type=int, default=[1024, 4096])
    a = p.parse_args()
    for cell in a.cells:
        programs.clear()
        model, _, x = dense_cell(cell)
        params = list(model.parameters())
        compiled = torch.compile(model)
        for T in a.through:
            small = torch.randn(T, x.shape[1], device=x.device, dtype=x.dtype, requires_grad=True)
            torch._dynamo.mark_dynamic(small, 0)
            for _ in range(30):
                step_fn(model, (small,), params)()
                step_fn(compiled, (small,), params)()
        torch._dynamo.mark_dynamic(x, 0)
        steps = {"eager": step_fn(model, (x,), params), "compiled": step_fn(compiled, (x,), params)}
        for step in steps.values():
            for _ in range(30):
                step()
        torch.cuda.synchronize()
        states(f"{cell} after 30 steps each")
        times: dict = {}
        for r in range(a.rounds):
            for enabled in ((True, False) if r % 2 == 0 else (False, True)):
                graphed.ENABLED = enabled
                for name, step in steps.items():
                    times.setdefault((name, enabled), []).append(time_ms(step, "cuda", a.reps))
        graphed.ENABLED = True
        for (name, enabled), t in times.items():
            print(f"{cell} {name:8s} graphs {'on ' if enabled else 'off'} " + " ".join(f"{v:.2f}" for v in t),
                  flush=True)
        print(f"{cell} peak reserved {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB, graphs hold "
              f"{graphed.held_bytes() / 2**20:.0f} MB", flush=True)
        del model, x, steps
        graphed.free()
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
