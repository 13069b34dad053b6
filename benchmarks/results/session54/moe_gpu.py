"""Session 54 probe (issue 20's MoE target at T=1024, where the composition ``permute -> experts -> unpermute``
measured 1.05-1.13x the faster torch in session 51 against ``expert_layer``'s 1.23-1.54x): is the composition's gap
GPU work or the host? Per variant (the composition, ``expert_layer``, the torch composition eager): step ms (median of
synchronised steps), host ms to enqueue a drained step, and the GPU time a step by kernel (torch.profiler), the
largest kernels listed.

    python benchmarks/results/session54/moe_gpu.py [--shapes qwen3 olmoe] [--T 1024] [--skewed]
"""
import argparse

import torch

from benchmarks._timing import cuda_kernel_times
from benchmarks.sizes import (
    MOE_SHAPES,
    FuseopsExpertLayer,
    FuseopsMoE,
    TorchMoE,
    enqueue_ms,
    moe_args,
    step_fn,
    time_ms,
)
from fuseops.ops.executor import graphed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["qwen3", "olmoe"])
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args()
    for shape in a.shapes:
        for skewed in (False, True):
            E, H, I, K = MOE_SHAPES[shape]
            torch.manual_seed(0)
            model = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
            reference = TorchMoE(model).to("cuda", torch.bfloat16)
            args = moe_args(a.T, E, H, K, skewed)
            runs = {"composition": (model, args, list(model.parameters())),
                    "expert_layer": (FuseopsExpertLayer(model), args, list(model.parameters())),
                    "torch": (reference, args, list(reference.parameters())),
                    "torch.compile": (torch.compile(reference), args, list(reference.parameters()))}
            steps = {name: step_fn(*run) for name, run in runs.items()}
            refusals = dict(graphed.refusals)
            for step in steps.values():
                for _ in range(30):
                    step()
            refused = {k: v - refusals.get(k, 0) for k, v in graphed.refusals.items() if v != refusals.get(k, 0)}
            best: dict[str, tuple[float, float]] = {}
            for r in range(a.rounds):
                for name, step in (steps.items() if r % 2 == 0 else reversed(steps.items())):
                    got = (time_ms(step, "cuda", a.reps), enqueue_ms(step, "cuda", a.reps))
                    best[name] = tuple(min(u, v) for u, v in zip(got, best.get(name, got)))
            cell = f"{shape} T={a.T} {'skewed' if skewed else 'uniform'}"
            print(f"{cell} graph refusals in the warm-up: {refused}", flush=True)
            for name, (ms, host) in best.items():
                times, launches = cuda_kernel_times(steps[name], 10)
                gpu = sum(times.values()) / 1e3
                print(f"{cell} {name:13} step {ms:5.2f} ms  host {host:5.3f}  GPU {gpu:5.3f} ms in "
                      f"{sum(launches.values())} kernels", flush=True)
                if name in ("composition", "expert_layer"):
                    for k, us in sorted(times.items(), key=lambda kv: -kv[1])[:a.top]:
                        print(f"    {us:7.1f} us x{launches[k]:<3} {k[:110]}")
            del model, reference, runs, steps


if __name__ == "__main__":
    main()
