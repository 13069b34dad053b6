"""Where the host time of one training step goes: cProfile of fwd+bwd steps of the dense stack
(``benchmarks.sizes``' 4 pre-norm GELU blocks) and of the MoE expert layer, fuseops beside the
same model in torch, after warm-up. Prints the enqueue time per step and the functions with the
most own time and the most cumulative time (issue 20: measure the host path first).

    python -m benchmarks.host_profile [--T 1024] [--H 1024] [--steps 20] [--top 35]
    python -m benchmarks.host_profile --device cpu --T 64 --H 64     # CPU, torch references
    python -m benchmarks.host_profile --compiled --T 4096              # under torch.compile too

``--compiled`` profiles each model under ``torch.compile`` as well (after ``--warmup`` steps:
the compile, and fuseops' recordings and CUDA-graph decisions inside its operators).

The steps run back to back: where the GPU is the bound (session 39: T=4096 H=1024), a full launch
queue blocks whichever call launches next, and the profile shows that wait, not host work.
``benchmarks/results/session39/drained_profile.py`` drains the device before each profiled step.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks._timing import profile_table, profiled
from benchmarks.sizes import FuseopsMoE, TorchMoE, fuseops_dense, routing, step_fn, torch_dense


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile(name: str, step, device: str, steps: int, top: int, warmup: int = 5) -> None:
    for _ in range(warmup):
        step()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    enqueue = (time.perf_counter() - start) * 1e3 / steps
    _sync(device)
    prof = profiled(step, steps)
    _sync(device)
    print(f"\n==== {name}: {enqueue:.3f} ms of host time per step (enqueue, {steps} steps)")
    for key in ("tottime", "cumulative"):
        print(profile_table(prof, key, top))


def count_ops(name: str, step) -> None:
    """The aten ops one step calls, by name (Triton launches are not aten ops)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: Counter = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls[str(func)] += 1
            return func(*args, **(kwargs or {}))

    with Count() as counter:
        step()
    print(f"\n==== {name}: {sum(counter.calls.values())} aten ops per step: {dict(counter.calls.most_common())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--T", type=int, default=1024)
    parser.add_argument("--H", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--parts", default="dense,moe")
    parser.add_argument("--no-launch", action="store_true",
                        help="skip Triton's launches (outputs left unwritten): the host path without them")
    parser.add_argument("--count-ops", action="store_true", help="also count the aten ops one step calls")
    parser.add_argument("--compiled", action="store_true", help="also each model under torch.compile")
    parser.add_argument("--warmup", type=int, default=30, help="steps before a compiled model's profile")
    args = parser.parse_args()
    if args.no_launch:
        from triton.runtime.jit import KernelInterface

        from fuseops.kernels import launch
        launch.ENABLED = False  # every launch through __getitem__
        KernelInterface.__getitem__ = lambda self, grid: (lambda *a, **k: None)
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    if "dense" in args.parts:
        model = fuseops_dense(args.H, "gelu").to(device, dtype)
        reference = torch_dense(model).to(device, dtype)
        x = torch.randn(args.T, args.H, device=device, dtype=dtype, requires_grad=True)
        profile("fuseops dense", step_fn(model, (x,), list(model.parameters())), device, args.steps, args.top)
        if args.count_ops:
            count_ops("fuseops dense", step_fn(model, (x,), list(model.parameters())))
            count_ops("torch dense", step_fn(reference, (x,), list(reference.parameters())))
        profile("torch dense", step_fn(reference, (x,), list(reference.parameters())), device, args.steps, args.top)
        if args.compiled:
            profile("fuseops dense compiled", step_fn(torch.compile(model), (x,), list(model.parameters())), device,
                    args.steps, args.top, args.warmup)
            profile("torch dense compiled", step_fn(torch.compile(reference), (x,), list(reference.parameters())),
                    device, args.steps, 10, args.warmup)
    if "moe" in args.parts:
        E, H, I, K = (64, 2048, 1024, 8) if device == "cuda" else (4, 64, 32, 2)
        model = FuseopsMoE(E, H, I).to(device, dtype)
        reference = TorchMoE(model).to(device, dtype)
        x = torch.randn(args.T, H, device=device, dtype=dtype, requires_grad=True)
        ids, weights = routing(args.T, E, K, False, device)
        weights = weights.to(dtype).requires_grad_()
        inputs = (x, ids, weights)
        profile("fuseops moe (OLMoE shape)", step_fn(model, inputs, list(model.parameters())), device,
                args.steps, args.top)
        if args.count_ops:
            count_ops("fuseops moe", step_fn(model, inputs, list(model.parameters())))
            count_ops("torch moe", step_fn(reference, inputs, list(reference.parameters())))
        profile("torch moe (OLMoE shape)", step_fn(reference, inputs, list(reference.parameters())), device,
                args.steps, 10)
        if args.compiled:
            profile("fuseops moe compiled", step_fn(torch.compile(model), inputs, list(model.parameters())), device,
                    args.steps, args.top, args.warmup)
            if dtype == torch.bfloat16:  # torch.compile of _grouped_mm traces only for bf16 operands
                profile("torch moe compiled", step_fn(torch.compile(reference), inputs, list(reference.parameters())),
                        device, args.steps, 10, args.warmup)


if __name__ == "__main__":
    main()
