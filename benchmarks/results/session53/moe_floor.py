"""Session 53 probe (issue 20's MoE host target, <= 0.5 ms a layer fwd+bwd): the host time of an MoE layer step
against its floor, one CUDA graph each way. Variants: ``fuseops.moe.expert_layer`` (its forward and backward each one
graph where the host is the bound), the torch composition eager (``benchmarks.sizes.TorchMoE``), and the same torch
module under ``torch.cuda.make_graphed_callables`` (torch's own one graph each way: an autograd Function replaying a
forward and a backward graph). Per variant: step ms (median of synchronised steps), host ms to enqueue a step after a
drain and while the device still runs the step before, and the drained step's phases (``_timing.step_phases``).

    python benchmarks/results/session53/moe_floor.py [--shapes qwen3 olmoe] [--T 1024]
"""
import argparse
import copy

import torch

from benchmarks._timing import step_phases
from benchmarks.sizes import (
    MOE_SHAPES,
    FuseopsExpertLayer,
    FuseopsMoE,
    TorchMoE,
    busy_enqueue_ms,
    enqueue_ms,
    moe_args,
    step_fn,
    time_ms,
)


class _Routed(torch.nn.Module):
    """``TorchMoE`` with the routing held (make_graphed_callables takes the tensors that need grad as arguments)."""

    def __init__(self, moe: TorchMoE, ids: torch.Tensor) -> None:
        super().__init__()
        self.moe, self.ids = moe, ids

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.moe(x, self.ids, weights)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", nargs="+", default=["qwen3", "olmoe"])
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    for shape in a.shapes:
        E, H, I, K = MOE_SHAPES[shape]
        torch.manual_seed(0)
        model = FuseopsMoE(E, H, I).to("cuda", torch.bfloat16)
        layer = FuseopsExpertLayer(model)
        reference = TorchMoE(model).to("cuda", torch.bfloat16)
        x, ids, weights = moe_args(a.T, E, H, K)
        runs = {"fuseops expert_layer": (layer, (x, ids, weights), list(model.parameters())),
                "torch eager": (reference, (x, ids, weights), list(reference.parameters()))}
        routed = _Routed(copy.deepcopy(reference), ids)
        try:
            graphed = torch.cuda.make_graphed_callables(routed, (x.detach().clone().requires_grad_(),
                                                                 weights.detach().clone().requires_grad_()))
            runs["torch graphed"] = (graphed, (x, weights), list(routed.parameters()))
        except Exception as e:  # noqa: BLE001 - a probe: say why and go on
            print(f"{shape}: torch graphed failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        steps = {name: step_fn(*run) for name, run in runs.items()}
        for step in steps.values():
            for _ in range(30):
                step()
        best: dict[str, tuple[float, float, float]] = {}
        for r in range(a.rounds):
            for name, step in (steps.items() if r % 2 == 0 else reversed(steps.items())):
                got = (time_ms(step, "cuda", a.reps), enqueue_ms(step, "cuda", a.reps),
                       busy_enqueue_ms(step, "cuda", a.reps))
                old = best.get(name, got)
                best[name] = tuple(min(u, v) for u, v in zip(got, old))
        for name, (ms, host, busy) in best.items():
            print(f"{shape} T={a.T} {name:22} step {ms:5.2f} ms  host {host:5.3f} ms drained, {busy:5.3f} busy  "
                  f"{step_phases(*runs[name])}", flush=True)


if __name__ == "__main__":
    main()
