"""Session 42 probe, for the next device session (issue 20: fuseops under torch.compile >= torch.compile): why a
compiled fuseops dense step takes more GPU time than the eager one at GPU-bound cells, where every recorded
program runs eagerly in both and the compiled graph holds only fuseops' operators (session 42, calls 3-4:
GELU H=4096 T=16384 83.0 / 83.8 ms compiled against 80.4 / 81.5 eager; SwiGLU 84.0 / 86.6 against 82.3 / 83.4;
session 40's per-kernel profile, eager then compiled, had the same kernels 8-12 % slower a launch in the
compiled step, which a GPU clock change would also give). Here the two variants alternate (A B B A ...), so a
drift in clocks reaches both: per round each variant's synchronised step (CUDA events, median of ``--steps``)
and its kernels (torch.profiler), then per kernel name the median over rounds of GPU time and launches a step,
and the kernels whose time differs most. Also the strides of the gradient each block's backward receives in
either variant (a materialised ``dy`` in one changes the cuBLAS layout: NTT against NNT kernels), and each
variant's ``graphed.counts`` a timed step (session 40's call 9 had the compiled step graph more of its programs
than the eager one at GELU T=4096 H=4096, 7.87 against 4.08 replays a step: a graph copies its moving inputs in,
and cuBLAS may pick other kernels under capture).

    python benchmarks/results/session42/compiled_gap.py [--cells gelu:16384:4096 swiglu:16384:4096] [--rounds 4]
"""
import argparse
import collections
import statistics

import torch

from benchmarks._timing import cuda_kernel_times
from benchmarks.sizes import dense_cell, step_fn
from fuseops import compiled_sequential
from fuseops.ops.executor import function as executor_function
from fuseops.ops.executor import graphed


def event_ms(step, steps: int) -> float:
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def dy_strides(step) -> list:
    """The (shape, strides, contiguous) of the ``dy`` each fuseops backward body received in one step."""
    seen = []
    real = executor_function.backward_body

    def spy(state, records, saved_tensors, dy, flat_extra_output_grads):
        seen.append(None if dy is None else (tuple(dy.shape), dy.stride(), dy.is_contiguous()))
        return real(state, records, saved_tensors, dy, flat_extra_output_grads)
    # The compiled Sequential's backward operator calls the name it imported.
    executor_function.backward_body = compiled_sequential.backward_body = spy
    try:
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    finally:
        executor_function.backward_body = compiled_sequential.backward_body = real
    return seen


def warm_eager_and_compiled(cell: str) -> tuple[dict, tuple]:
    """Steps of ``cell``'s fuseops stack, eager and compiled (two models of the same seed), each
    warmed up 30 steps; and (the eager model, the compiled one's module, the input)."""
    model, _, x = dense_cell(cell)
    compiled_model, _, _ = dense_cell(cell)
    steps = {"eager": step_fn(model, (x,), list(model.parameters())),
             "compiled": step_fn(torch.compile(compiled_model), (x,), list(compiled_model.parameters()))}
    for step in steps.values():
        for _ in range(30):
            step()
    return steps, (model, compiled_model, x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:16384:4096", "swiglu:16384:4096"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--top", type=int, default=10)
    a = p.parse_args()
    for cell in a.cells:
        steps, (model, compiled_model, x) = warm_eager_and_compiled(cell)
        walls = {name: [] for name in steps}
        kernels = {name: [] for name in steps}
        counts = {name: collections.Counter() for name in steps}
        for r in range(a.rounds):
            order = list(steps) if r % 2 == 0 else list(reversed(steps))
            for name in order:
                before = dict(graphed.counts)
                walls[name].append(event_ms(steps[name], a.steps))
                counts[name].update({k: graphed.counts[k] - v for k, v in before.items()})
                kernels[name].append(cuda_kernel_times(steps[name], 2))
        print(f"\n== {cell}: step ms by round (alternating order): " + "; ".join(
            f"{name} {', '.join(f'{w:.2f}' for w in ws)}" for name, ws in walls.items()))
        med = {}
        for name, runs in kernels.items():
            names = set().union(*(t for t, _ in runs))
            med[name] = {k: (statistics.median(t.get(k, 0.0) for t, _ in runs),
                             statistics.median(n.get(k, 0) for _, n in runs)) for k in names}
        total = {name: sum(v for v, _ in m.values()) for name, m in med.items()}
        print(f"   kernel time a step (median over rounds): eager {total['eager'] / 1e3:.2f} ms, "
              f"compiled {total['compiled'] / 1e3:.2f} ms")
        names = set(med["eager"]) | set(med["compiled"])
        diffs = sorted(names, key=lambda k: -abs(med["compiled"].get(k, (0, 0))[0] - med["eager"].get(k, (0, 0))[0]))
        for k in diffs[:a.top]:
            (te, ne), (tc, nc) = med["eager"].get(k, (0.0, 0)), med["compiled"].get(k, (0.0, 0))
            print(f"   {tc - te:+9.1f} us  eager {te:9.1f} x {ne:3.0f}  compiled {tc:9.1f} x {nc:3.0f}  {k[:110]}")
        for name, step in steps.items():
            # Graph use differs where the decision does: a graphed program copies its moving inputs in.
            per_step = {k: round(v / (a.rounds * a.steps), 2) for k, v in counts[name].items() if v}
            print(f"   {name}: graphed.counts a timed step {per_step}")
            print(f"   {name}: dy of each backward body {dy_strides(step)}")
        del model, compiled_model, x, steps
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
