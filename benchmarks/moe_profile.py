"""Where a step of the MoE expert layer spends its GPU time: the kernels of a few
forward+backward steps (torch.profiler), per step, for fuseops and the plain-torch layer of
benchmarks/moe_layer.py, after sustained warm-up (clocks settle under load).

    python -m benchmarks.moe_profile [--shape mixtral-8x7b] [--steps 5] [--warmup-s 10]
                                     [--impls fuseops torch "fuseops fp8 blk"] [--update]

``--update``: each step is ``fp8_moe``'s optimizer step of one micro-batch (the forward+backward,
then an in-place update of the expert weights), so a quantized layer quantizes its weights again
every step, as at that benchmark's one-micro-batch cadence.
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks._moe_impls import IMPLS, implementations, make_case
from benchmarks.fp8_moe import optimizer_step
from benchmarks.moe_layer import SHAPES, forward_backward, set_grads_to_none


def kernel_times(step, case, steps: int, warmup_s: float) -> tuple[dict[str, float], float]:
    """Milliseconds per step by kernel name, and wall milliseconds per step."""
    end = time.time() + warmup_s
    while time.time() < end:
        set_grads_to_none(case)
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            set_grads_to_none(case)
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3 / steps
    totals: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:90]] += event.device_time / 1e3 / steps
    return dict(totals), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="mixtral-8x7b", choices=list(SHAPES))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--impls", nargs="*", default=["fuseops", "torch"], choices=IMPLS)
    parser.add_argument("--update", action="store_true", help="update the expert weights after every step")
    args = parser.parse_args()
    case = make_case(**SHAPES[args.shape])
    impls = implementations(case, args.impls)
    for name in args.impls:
        layer = impls[name]
        step = optimizer_step(case, layer, 1) if args.update else forward_backward(case, layer)
        totals, wall = kernel_times(step, case, args.steps, args.warmup_s)
        busy = sum(totals.values())
        print(f"\n{name}: wall {wall:.2f} ms/step, kernels {busy:.2f} ms/step ({len(totals)} kinds)")
        for kernel, ms in sorted(totals.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {ms:7.3f}  {kernel}")


if __name__ == "__main__":
    main()
