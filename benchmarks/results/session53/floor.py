"""Session 53 probe (issue 20): the host-bound dense cell against its floors. Beside fuseops eager, torch eager and
torch's per-block graphs (session 52's ``per_block_graphs.py``), fuseops with the whole model under
``torch.cuda.make_graphed_callables`` (its GPU time alone: no host in the step) and torch whole-graphed; then the GPU
time of one step's kernels (torch.profiler, CUDA activity only) for fuseops eager and torch eager. Interleaved rounds;
step ms (median of synchronised steps), host ms to enqueue a step after a drain.

    python benchmarks/results/session53/floor.py [--cells gelu:1024:2048 gelu:1024:1024]
"""
import argparse
import copy

import torch

from benchmarks._timing import cuda_kernel_times
from benchmarks.sizes import dense_cell, enqueue_ms, step_fn, time_ms


def kernel_ms(step) -> tuple[float, int]:
    """GPU ms of one step's kernels and their count (``_timing.cuda_kernel_times`` after a warm-up)."""
    for _ in range(10):
        step()
    times, launches = cuda_kernel_times(step, 20)
    return sum(times.values()) / 1e3, sum(launches.values())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:1024:2048", "gelu:1024:1024"])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kernels", action="store_true", help="also the kernels' GPU time (torch.profiler)")
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        variants = {"fuseops": step_fn(model, (x,), list(model.parameters())),
                    "torch": step_fn(reference, (x,), list(reference.parameters()))}
        per_block = copy.deepcopy(reference)
        samples = tuple((torch.randn_like(x, requires_grad=True),) for _ in per_block)
        graphed_blocks = torch.nn.Sequential(*torch.cuda.make_graphed_callables(tuple(per_block), samples))
        variants["torch graphed per block"] = step_fn(graphed_blocks, (x,), list(per_block.parameters()))
        whole = copy.deepcopy(reference)
        variants["torch graphed whole"] = step_fn(torch.cuda.make_graphed_callables(whole, (x,)), (x,),
                                                  list(whole.parameters()))
        try:
            mine = copy.deepcopy(model)
            variants["fuseops graphed whole"] = step_fn(torch.cuda.make_graphed_callables(mine, (x,)), (x,),
                                                        list(mine.parameters()))
        except Exception as e:  # noqa: BLE001 - a probe: say why and go on
            print(f"{cell}: fuseops whole graphed failed: {type(e).__name__}: {e}", flush=True)
        for step in variants.values():
            for _ in range(30):
                step()
        best: dict[str, tuple[float, float]] = {}
        for r in range(a.rounds):
            for name, step in (variants.items() if r % 2 == 0 else reversed(variants.items())):
                ms, host = time_ms(step, "cuda", a.reps), enqueue_ms(step, "cuda", a.reps)
                old = best.get(name)
                best[name] = (min(ms, old[0]) if old else ms, min(host, old[1]) if old else host)
        torch_ms = best["torch"][0]
        for name, (ms, host) in best.items():
            print(f"{cell:16} {name:24} step {ms:5.2f} ms  host {host:5.2f} ms  torch eager / this {torch_ms / ms:4.2f}x",
                  flush=True)
        if a.kernels:
            for name in ("fuseops", "torch"):
                gpu, n = kernel_ms(variants[name])
                print(f"{cell:16} {name:24} kernels {gpu:5.2f} ms a step, {n} launches", flush=True)


if __name__ == "__main__":
    main()
