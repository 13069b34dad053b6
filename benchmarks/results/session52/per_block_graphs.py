"""Session 52 probe (issue 20): the floor of graphing each block on its own, as fuseops does. The dense stack's
torch model with each block's forward and backward one CUDA graph (``torch.cuda.make_graphed_callables`` over the
four blocks, torch's own per-module graphs: an autograd Function a block, a graph replay each way) beside fuseops
eager (its programs graphed per block under the default), torch eager and the whole model graphed. Interleaved
rounds; each variant's step ms (median of synchronised steps) and host ms to enqueue a step after a drain.

    python benchmarks/results/session52/per_block_graphs.py [--cells gelu:1024:2048 gelu:1024:1024]
"""
import argparse
import copy

import torch

from benchmarks.sizes import dense_cell, enqueue_ms, step_fn, time_ms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cells", nargs="+", default=["gelu:1024:2048", "gelu:1024:1024"])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    for cell in a.cells:
        model, reference, x = dense_cell(cell)
        per_block = copy.deepcopy(reference)
        samples = tuple((torch.randn_like(x, requires_grad=True),) for _ in per_block)
        graphed_blocks = torch.cuda.make_graphed_callables(tuple(per_block), samples)
        per_block_model = torch.nn.Sequential(*graphed_blocks)
        whole = copy.deepcopy(reference)
        whole_graphed = torch.cuda.make_graphed_callables(whole, (x,))
        variants = {
            "fuseops": step_fn(model, (x,), list(model.parameters())),
            "torch": step_fn(reference, (x,), list(reference.parameters())),
            "torch graphed per block": step_fn(per_block_model, (x,), list(per_block.parameters())),
            "torch graphed whole": step_fn(whole_graphed, (x,), list(whole.parameters())),
        }
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


if __name__ == "__main__":
    main()
