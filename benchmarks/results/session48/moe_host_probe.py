"""Session 48 probe (issue 20's MoE host target, 0.5 ms): where an ``expert_layer`` step's host time goes with both of
its graphs kept. Session 48's run 3 measured 0.71 ms to issue a Qwen3 T=4096 step with both kept
(``shared_pool.py``'s ``all_shared``); on this CPU the same step with the stand-in graphs' replays made no-ops takes
95 us (our Python, the autograd engine and the Function around two graph calls). Prints the phases, the drained issue
time, the host time in each function (cProfile, the top 25 by cumulative time) and the CUDA runtime calls of one step
(torch.profiler: each runtime call's count and host time).

    python benchmarks/results/session48/moe_host_probe.py [qwen3|olmoe|mixtral] [T] [all]
"""
import cProfile
import pstats
import sys
import time

import torch

from benchmarks.sizes import MOE_SHAPES, FuseopsExpertLayer, FuseopsMoE, moe_args, step_fn
from fuseops.moe import routing_graphs
from fuseops.ops.executor import graphed


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "qwen3"
    T = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    if sys.argv[3:] == ["all"]:
        graphed.GPU_BOUND = float("inf")
    E, H, I, K = MOE_SHAPES[shape]
    torch.manual_seed(0)
    model = FuseopsExpertLayer(FuseopsMoE(E, H, I).to("cuda", torch.bfloat16))
    step = step_fn(model, moe_args(T, E, H, K, False, "cuda", torch.bfloat16), list(model.parameters()))
    for _ in range(40):
        step()
    torch.cuda.synchronize()
    print(shape, T, {key[1]: [s.phase for s in kept] for key, kept in routing_graphs.states().items()})
    issue = []
    for _ in range(20):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        issue.append(1e3 * (time.perf_counter() - t))
    print(f"drained issue time: median {sorted(issue)[10]:.3f} ms, min {min(issue):.3f}")
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20):
        step()
        torch.cuda.synchronize()
    profile.disable()
    pstats.Stats(profile).sort_stats("cumtime").print_stats(25)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
