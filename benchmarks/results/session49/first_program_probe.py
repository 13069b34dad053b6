"""Session 49 probe, for the next device session: why the first forward program of the 4-block GELU stack starts
measuring a step after the others on the GPU (run 12's churn log: its graph state first called at step 3, the other
seven at step 2; on this CPU with the stand-in graphs all eight at step 2), which has its seven consumers captured
again under FUSEOPS_CUDA_GRAPHS=all. Logs each recording (step, direction, the key's hash, program or refusal) and each
new graph state for the first four steps.

    python benchmarks/results/session49/first_program_probe.py [gelu:4096:4096]
"""
import sys

import torch

from benchmarks.sizes import dense_cell, step_fn
from fuseops.ops.executor import graphed, replay

step_now = [0]


def main() -> None:
    cell = sys.argv[1] if len(sys.argv) > 1 else "gelu:4096:4096"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, _, x = dense_cell(cell, device, torch.bfloat16)
    step = step_fn(model, (x,), list(model.parameters()))
    keep, new_state = replay.keep, graphed.GraphedProgram.__init__

    def logged_keep(layouts, direction, key, program):
        what = type(program).__name__ if isinstance(program, replay.Program) else f"refused: {program}"
        print(f"step {step_now[0]} keep {direction} key {hash(key) & 0xffff:04x} layouts {id(layouts) & 0xffff:04x} {what}",
              flush=True)
        return keep(layouts, direction, key, program)

    def logged_state(self, *args, **kwargs):
        new_state(self, *args, **kwargs)
        print(f"step {step_now[0]} new graph state {id(self) & 0xffff:04x}", flush=True)

    replay.keep, graphed.GraphedProgram.__init__ = logged_keep, logged_state
    for i in range(4):
        step_now[0] = i
        before = dict(replay.counts)
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        print(f"-- step {i}: replay counts {({k: v - before.get(k, 0) for k, v in replay.counts.items()})}, "
              f"refusals {replay.refusals}", flush=True)


if __name__ == "__main__":
    main()
