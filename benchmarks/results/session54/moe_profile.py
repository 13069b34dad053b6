"""Session 54 probe: where the MoE composition's host time goes at steady state (run 3 found its unpermute backward
taking 88-245 us of host a call, graphed or eager, against 11-19 us for unpermute's forward graph). A cProfile of
drained steps with the backward run on the calling thread (``torch.autograd.set_multithreading_enabled(False)``), and
the host time inside ``CUDAGraph.replay`` per call.

    python benchmarks/results/session54/moe_profile.py [--shape qwen3] [--T 1024] [--skewed]
"""
import argparse
import time

import torch

from benchmarks._timing import profile_table, profiled
from benchmarks.sizes import MOE_SHAPES, FuseopsMoE, moe_args, step_fn

_replays: list[float] = []
_replay = torch.cuda.CUDAGraph.replay


def _timed_replay(self):
    t0 = time.perf_counter()
    _replay(self)
    _replays.append((time.perf_counter() - t0) * 1e6)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen3")
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--skewed", action="store_true")
    a = p.parse_args()
    E, H, I, K = MOE_SHAPES[a.shape]
    torch.manual_seed(0)
    model = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
    args = moe_args(a.T, E, H, K, a.skewed)
    step = step_fn(model, args, list(model.parameters()))
    for threads in (True, False):
        torch.autograd.set_multithreading_enabled(threads)
        for _ in range(60):
            step()
        torch.cuda.synchronize()
        torch.cuda.CUDAGraph.replay = _timed_replay
        for _ in range(3):
            _replays.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            host = (time.perf_counter() - t0) * 1e6
            print(f"threads={threads} step host {host:.0f} us, replays (us):", [round(r) for r in _replays])
        torch.cuda.CUDAGraph.replay = _replay
    prof = profiled(step, 20, torch.cuda.synchronize)
    print(profile_table(prof, "tottime", 30))
    print(profile_table(prof, "cumulative", 45))


if __name__ == "__main__":
    main()
