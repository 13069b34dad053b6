"""Session 28: where a compiled step's host time goes (issue 20: compiled fuseops 0.71-0.83x of
torch.compile at MoE T=1024, 0.87-1.0x on the dense cells). For each cell: fuseops under
``torch.compile`` and the torch model under ``torch.compile``, step and enqueue milliseconds
(``sizes.time_ms`` / ``enqueue_ms``); then our launchers' host time per step by kernel (each
dispatch-table launcher wrapped in a timer: its Python and its launches), and the compiled step's
enqueue with every launcher stubbed (``host_cpu.stub_kernels``: what is left is torch's part and
our ops' wrappers).

    python benchmarks/results/session28/compiled_host.py [moe:qwen3:1024] [gelu:1024:2048] ...
"""
import collections
import functools
import sys
import time

import torch

from benchmarks import sizes
from benchmarks.host_cpu import stub_kernels
from fuseops.kernels import dispatch

REPS = 20
spent: dict[str, float] = collections.defaultdict(float)


def time_launchers() -> None:
    real = dispatch._callable

    def timed(kernel, backend):
        run = real(kernel, backend)

        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return run(*args, **kwargs)
            finally:
                spent[kernel.name] += time.perf_counter() - start
        return call
    dispatch._callable = functools.cache(timed)


def build(cell: str):
    if cell.startswith("moe:"):
        _, shape, T = cell.split(":")
        E, H, F, K = sizes.MOE_SHAPES[shape]
        torch.manual_seed(0)
        mine = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
        theirs = sizes.TorchMoE(mine).cuda().bfloat16()
        return mine, theirs, sizes.moe_args(int(T), E, H, K)
    mine, theirs, x = sizes.dense_cell(cell)
    return mine, theirs, (x,)


cells = sys.argv[1:] or ["moe:qwen3:1024", "moe:olmoe:1024", "gelu:1024:2048", "swiglu:1024:2048"]
time_launchers()
results = []
for cell in cells:
    mine, theirs, args = build(cell)
    steps = {}
    for name, model in (("fuseops compiled", mine), ("torch.compile", theirs)):
        params = list(model.parameters())
        steps[name] = sizes.step_fn(torch.compile(model), args, params)
        for _ in range(sizes.WARMUP_STEPS):
            steps[name]()
    row = {"cell": cell}
    for name, step in steps.items():
        row[name] = (sizes.time_ms(step, "cuda", REPS), sizes.enqueue_ms(step, "cuda", REPS))
    spent.clear()
    sizes.enqueue_ms(steps["fuseops compiled"], "cuda", REPS)
    row["launchers"] = {k: v * 1e6 / REPS for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    results.append((row, steps["fuseops compiled"]))
    print(cell, {k: v for k, v in row.items() if k != "cell"}, flush=True)
stub_kernels()  # wraps the timed launchers: a stub answers before them after its first call
for row, step in results:
    for _ in range(3):
        step()
    row["stubbed enqueue"] = sizes.enqueue_ms(step, "cuda", REPS)
print("\n| cell | fuseops compiled ms (enqueue) | torch.compile ms (enqueue) | ratio | launchers us | stubbed enqueue ms |")
print("| --- | --- | --- | --- | --- | --- |")
for row, _ in results:
    (fs, fe), (ts, te) = row["fuseops compiled"], row["torch.compile"]
    print(f"| {row['cell']} | {fs:.2f} ({fe:.2f}) | {ts:.2f} ({te:.2f}) | {ts / fs:.2f}x | "
          f"{sum(row['launchers'].values()):.0f} | {row['stubbed enqueue']:.2f} |")
for row, _ in results:
    print(row["cell"], ", ".join(f"{k} {v:.0f}" for k, v in row["launchers"].items()))
