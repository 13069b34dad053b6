"""Where a replayed step's host time goes (issue 20): the recorded programs' source for one dense
block (GELU, SwiGLU) and the MoE experts, then a cProfile of replayed fwd+bwd steps, by tottime.

    python benchmarks/results/session22/replay_profile.py [--cell gelu|swiglu|moe] [--steps 200]
"""
import argparse

import torch

from benchmarks import sizes
from benchmarks._timing import profile_table, profiled
from fuseops.ops.executor import replay


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", nargs="*", default=["gelu", "swiglu", "moe"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    for cell in a.cells:
        torch.manual_seed(0)
        if cell == "moe":
            E, H, I, K = sizes.MOE_SHAPES["qwen3"]
            m = sizes.FuseopsMoE(E, H, I).to(dev, dt)
            ids, w = sizes.routing(1024, E, K, False, dev)
            args = (torch.randn(1024, H, device=dev, dtype=dt), ids, w.to(dt))
            seq = m.experts
        else:
            m = sizes.fuseops_dense(1024, cell).to(dev, dt)
            args = (torch.randn(1024, 1024, device=dev, dtype=dt),)
            seq = m.blocks[1]
        step = sizes.step_fn(m, args, list(m.parameters()))
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        for prep in seq._calls._runs.values():
            if prep.layouts is None:
                continue
            for direction, table in (("forward", prep.layouts.forward), ("backward", prep.layouts.backward)):
                if table is None:
                    print(f"== {cell} {direction} refused (replay.refusals: {replay.refusals})")
                    continue
                for program in table.values():
                    if program is not None:
                        print(f"== {cell} {direction}\n{program.source}")
        before = replay.counts["replayed"]
        prof = profiled(step, a.steps)
        torch.cuda.synchronize()
        print(f"== {cell}: {replay.counts['replayed'] - before} replays in {a.steps} steps")
        print(profile_table(prof, "tottime", a.top))


if __name__ == "__main__":
    main()
