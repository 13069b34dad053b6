"""Session 54 probe: what inflates the host samples the MoE composition's graph states are judged on. Run 3 found the
unpermute backward's eager and graph samples both 88-193 us of host (the graph replays in 17-40 us at steady state,
run 4), so that its graph was judged no faster and dropped for good, and the experts' backward after it (its input
left graph memory). Per graph-state call of the first ``--steps`` steps: phase before and after, host us, the host us
inside ``CUDAGraph.replay``, and the caching allocator's cudaMalloc / cudaFree calls during it.

    python benchmarks/results/session54/moe_warmup.py [--shape qwen3] [--T 1024] [--skewed] [--steps 16]
"""
import argparse
import time

import torch

from benchmarks.sizes import MOE_SHAPES, FuseopsMoE, moe_args, step_fn
from fuseops.ops.executor import graphed

_replay_us = [0.0]
_replay = torch.cuda.CUDAGraph.replay
_run = graphed.GraphedProgram.run
_names: dict[int, str] = {}


def _timed_replay(self):
    t0 = time.perf_counter()
    _replay(self)
    _replay_us[0] += (time.perf_counter() - t0) * 1e6


def _device_calls() -> tuple[int, int]:
    stats = torch.cuda.memory_stats()
    return stats.get("num_device_alloc", 0), stats.get("num_device_free", 0)


def _traced(self, inputs):
    name = _names.setdefault(id(self), f"s{len(_names)}")
    phase = self.phase
    allocs, frees = _device_calls()
    _replay_us[0] = 0.0
    t0 = time.perf_counter()
    out = _run(self, inputs)
    us = (time.perf_counter() - t0) * 1e6
    allocs2, frees2 = _device_calls()
    print(f"  {name} {phase:>9} -> {self.phase:9} host {us:6.0f} replay {_replay_us[0]:5.0f} "
          f"cudaMalloc {allocs2 - allocs} cudaFree {frees2 - frees}")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen3")
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--skewed", action="store_true")
    p.add_argument("--steps", type=int, default=16)
    a = p.parse_args()
    E, H, I, K = MOE_SHAPES[a.shape]
    torch.manual_seed(0)
    model = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
    step = step_fn(model, moe_args(a.T, E, H, K, a.skewed), list(model.parameters()))
    graphed.GraphedProgram.run = _traced
    torch.cuda.CUDAGraph.replay = _timed_replay
    for i in range(a.steps):
        print(f"step {i}", flush=True)
        step()
    print("refusals", graphed.refusals)


if __name__ == "__main__":
    main()
