"""Why ``fuseops.moe.expert_layer`` runs slower than the composition at the Mixtral shape:
the kernels of one fwd+bwd of each (torch.profiler, CUDA time per kernel name), and the
layer timed with memory_model's weight-gradient order forced either way.

    python -m benchmarks.moe_layer_profile [--shape mixtral-8x7b]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
import triton

from benchmarks.moe_layer import SHAPES, composed_layer, fuseops_layer, make_case
from fuseops.moe import memory_model


def kernels(name: str, layer, case) -> None:
    for _ in range(3):
        layer().backward(case.dy)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        layer().backward(case.dy)
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name[:70]] += e.device_time_total / 1e3
    print(f"\n== {name}: {sum(total.values()):.2f} ms of kernels")
    for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:14]:
        print(f"  {v:8.3f} ms  {k}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="mixtral-8x7b", choices=list(SHAPES))
    args = parser.parse_args()
    case = make_case(**SHAPES[args.shape])
    mine, composed = fuseops_layer(case), composed_layer(case)
    kernels("expert_layer", mine, case)
    kernels("composed", composed, case)
    step = lambda layer: (lambda: layer().backward(case.dy))  # noqa: E731
    order = memory_model.fc1_weight_grad_first
    for forced in (None, True, False):
        if forced is not None:
            memory_model.fc1_weight_grad_first = lambda shape, lean, forced=forced: forced
        ms = triton.testing.do_bench(step(mine), rep=100)
        print(f"expert_layer fwd+bwd, FC1 weight grad first = {forced if forced is not None else 'model'}: {ms:.2f} ms")
    memory_model.fc1_weight_grad_first = order
    print(f"composed fwd+bwd: {triton.testing.do_bench(step(composed), rep=100):.2f} ms")


if __name__ == "__main__":
    main()
