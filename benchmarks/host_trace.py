"""Where a step's host time goes, op by op, on the GPU: ``torch.profiler`` (CPU activity
only) over fwd+bwd steps of the dense block of ``benchmarks.host_costs`` (RMSNorm,
Linear+bias+GELU(tanh), Linear+bias, residual; ``--part dense``) or of ``benchmarks.sizes``'
MoE layer (OLMoE shape, permute, grouped SwiGLU MLP, unpermute; ``--part moe``), fuseops
beside the same model in torch.
Prints each aten op's and Triton launch's self host time per step, and the time the step
spends in the forward, in the autograd engine and in our backward's Python (issue 20: the
backward is ~85 % of the block's host time, where the forward is within 3x of torch's).

    python -m benchmarks.host_trace [--part dense] [--H 1024] [--rows 64] [--steps 50] [--top 25] [--device cuda]
    python -m benchmarks.host_trace --part moe [--rows 1024]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import fuseops
from fuseops import ops
from fuseops.ops.executor import function


def timed_backward(spent: dict[str, float]) -> None:
    """``spent["ours"]`` accumulates the seconds spent inside ``PlanFunction.backward`` (our
    Python and its launches)."""
    spent["ours"] = 0.0
    inner = function.PlanFunction.backward

    def backward(ctx, *grads):
        start = time.perf_counter()
        try:
            return inner(ctx, *grads)
        finally:
            spent["ours"] += time.perf_counter() - start

    function.PlanFunction.backward = staticmethod(backward)


def split_step(model, inputs, steps: int, spent: dict[str, float] | None) -> tuple[float, float, float]:
    """Host microseconds per step of the forward, of backward(), and inside our backward."""
    fwd = bwd = 0.0
    if spent is not None:
        spent["ours"] = 0.0
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        start = time.perf_counter()
        loss = model(*inputs).sum()
        mid = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        fwd, bwd = fwd + mid - start, bwd + end - mid
        if inputs[0].is_cuda:
            torch.cuda.synchronize()
    ours = spent["ours"] if spent is not None else 0.0
    return fwd * 1e6 / steps, bwd * 1e6 / steps, ours * 1e6 / steps


spent: dict[str, float] = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--H", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=None, help="64 dense, 1024 moe")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--part", choices=("dense", "moe"), default="dense")
    args = parser.parse_args()
    args.rows = args.rows or (64 if args.part == "dense" else 1024)
    timed_backward(spent)
    models, inputs = (dense_models if args.part == "dense" else moe_models)(args)
    for name, model in models.items():
        split_step(model, inputs, 20, spent)
        fwd, bwd, ours = split_step(model, inputs, args.steps, spent)
        print(f"{name:8s} host us per step: forward {fwd:7.1f}, backward() {bwd:7.1f}"
              + (f" of which in PlanFunction.backward {ours:7.1f}" if name == "fuseops" else ""))
    for name, model in models.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            split_step(model, inputs, args.steps, None)
        by_thread: dict[int, float] = defaultdict(float)
        for e in prof.events():
            if e.cpu_parent is None:
                by_thread[e.thread] += e.cpu_time_total / args.steps
        print(f"\n== {name}: top-level host us per step by thread {dict(by_thread)}")
        rows = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:args.top]
        print(f"{'op':60s} {'calls/step':>10s} {'self us/step':>12s} {'us/call':>8s}")
        for a in rows:
            print(f"{a.key[:60]:60s} {a.count / args.steps:10.1f} {a.self_cpu_time_total / args.steps:12.1f} "
                  f"{a.self_cpu_time_total / max(a.count, 1):8.1f}")


def moe_models(args) -> tuple[dict[str, torch.nn.Module], tuple[torch.Tensor, ...]]:
    from benchmarks.sizes import FuseopsMoE, TorchMoE, routing

    E, H, I, K = 64, 2048, 1024, 8
    mine = FuseopsMoE(E, H, I).to(args.device, torch.bfloat16)
    ids, weights = routing(args.rows, E, K, False, args.device)
    x = torch.randn(args.rows, H, device=args.device, dtype=torch.bfloat16, requires_grad=True)
    return {"fuseops": mine, "torch": TorchMoE(mine)}, (x, ids, weights.to(torch.bfloat16).requires_grad_())


def dense_models(args) -> tuple[dict[str, torch.nn.Module], tuple[torch.Tensor, ...]]:
    H, dt = args.H, torch.bfloat16
    block = fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, 4 * H), ops.GELU(approximate="tanh"),
                               ops.Linear(4 * H, H), ops.AddExtraInput()).to(args.device, dt)
    ref = torch.nn.Sequential(torch.nn.RMSNorm(H), torch.nn.Linear(H, 4 * H), torch.nn.GELU(approximate="tanh"),
                              torch.nn.Linear(4 * H, H)).to(args.device, dt)

    class Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = ref

        def forward(self, x, _):
            return self.inner(x) + x

    x = torch.randn(args.rows, H, device=args.device, dtype=dt, requires_grad=True)
    return {"fuseops": block, "torch": Residual()}, (x, x)


if __name__ == "__main__":
    main()
