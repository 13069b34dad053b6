"""Session 43 probe, for the next device session (issue 20: fuseops under torch.compile >= torch.compile): where a
compiled dense step's host time goes before and between its launches, against the eager step's, in one process
(alternating blocks). Call 9 (``compiled_idle.py``) found the compiled step's first kernel starting 0.35-0.5 ms
later than the eager one's on the H100 host (drained steps), and compiled fuseops 1-3 % slower than eager at every
GPU-bound cell of call 8. Per variant, medians over drained steps: the step's host time; the time from the step's
start to its first recorded-program replay (``replay.replayed``: the first op's launches follow it; for the
compiled step that span holds Dynamo's guards on the frame, the AOT wrappers and Inductor's call preamble); and
each piece's inclusive host time a step (``compiled_sequential``'s ``_running`` / ``_owns`` / ``_fresh_all`` /
``_new_carried`` / ``_forward_results`` / ``_gradients``, the replays), nested pieces inside their parents.

Smoke run on this CPU (gelu:64:64, float32, 2 blocks of 5): to the first replay 49 us eager, 131 compiled; a
throwaway timeline of the same step had ``_forward_results`` entered 114 us into it and the first replay 16 us later,
so on the CPU the compiled step's extra wait is torch.compile's runtime before our operator (Dynamo's guards on the
frame: 524 on this stack, ``TORCH_LOGS=guards``; the AOT wrappers; Inductor's call; the operator's dispatch with a
``Tensor[]`` argument), not our operator's Python.

    python benchmarks/results/session43/compiled_host_parts.py [--cells gelu:1024:1024 gelu:16384:4096] [--blocks 4]
"""
import argparse
import collections
import statistics
import time

import torch

from benchmarks.results.session42.moe_host_parts import SPENT, sync, timed
from benchmarks.sizes import dense_cell, step_fn
from fuseops import compiled_sequential
from fuseops.ops.executor import replay

FIRST: list[float] = []  # the first replay's clock reading in the current step, if any


def noting_first(owner, name: str) -> None:
    """Replace ``owner.name`` by a wrapper noting when its first call of a step began (``FIRST``)."""
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if not FIRST:
            FIRST.append(time.perf_counter())
        return real(*args, **kwargs)
    setattr(owner, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:1024:1024", "gelu:16384:4096"])
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="steps a block")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    timed(replay, "replayed", "replay.replayed (every program)")
    noting_first(replay, "replayed")
    for name in ("_running", "_owns", "_fresh_all", "_new_carried", "_forward_results", "_gradients"):
        timed(compiled_sequential, name, f"compiled_sequential.{name}")
    for cell in a.cells:
        act, T, H = cell.split(":")
        if device == "cpu":
            cell = f"{act}:64:64"
        model, _, x = dense_cell(cell, device, dtype)
        compiled_model, _, _ = dense_cell(cell, device, dtype)
        steps = {"eager": step_fn(model, (x,), list(model.parameters())),
                 "compiled": step_fn(torch.compile(compiled_model), (x,), list(compiled_model.parameters()))}
        for step in steps.values():
            for _ in range(30):
                step()
        sync(device)
        host, to_first, pieces = (collections.defaultdict(list) for _ in range(3))
        for block in range(a.blocks):
            for name in (list(steps) if block % 2 == 0 else list(reversed(steps))):
                for _ in range(a.steps):
                    sync(device)
                    SPENT.clear()
                    FIRST.clear()
                    start = time.perf_counter()
                    steps[name]()
                    host[name].append(time.perf_counter() - start)
                    to_first[name].append(FIRST[0] - start if FIRST else float("nan"))
                    for label, spent in SPENT.items():
                        pieces[name, label].append(spent)
                sync(device)
        print(f"\n== {cell}, {device}: host us a drained step, medians over {a.blocks} alternating blocks of {a.steps}")
        for name in steps:
            print(f"   {name:9s} step {statistics.median(host[name]) * 1e6:8.1f}   to the first replay "
                  f"{statistics.median(to_first[name]) * 1e6:8.1f}")
            for (variant, label), spent in sorted(pieces.items()):
                if variant == name:
                    print(f"      {statistics.median(spent) * 1e6:8.1f}  {label}")
        del model, compiled_model, x, steps
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
