"""Replayed plan runs (issue 20) against the full path, one process, interleaved: dense stacks and
MoE layers from ``benchmarks.sizes``, bf16. Training steps (fwd+bwd) by default, forwards under
``torch.no_grad()`` with ``--no-grad``. First a bitwise check (outputs, and with grad every gradient,
over three calls, replay on and off), then step and enqueue ms in alternating rounds.

    python benchmarks/results/session23/replay_ab.py [--reps 30] [--rounds 3] [--no-grad] [--cells ...]
"""
import argparse

import torch

from benchmarks import sizes
from fuseops.ops.executor import replay

DENSE = {"gelu1k": ("gelu", 1024, 1024), "gelu4k": ("gelu", 4096, 1024), "swiglu1k": ("swiglu", 1024, 1024),
         "gelu4k2k": ("gelu", 4096, 2048)}
MOE = {"qwen3_1k": ("qwen3", 1024), "olmoe_1k": ("olmoe", 1024), "qwen3_4k": ("qwen3", 4096)}


def outputs_of(model, args, grad):
    if not grad:
        with torch.no_grad():
            return [model(*args)]
    for p in model.parameters():
        p.grad = None
    inputs = [a.detach().clone().requires_grad_() if a.is_floating_point() else a for a in args]
    y = model(*inputs)
    y.float().square().sum().backward()
    return [y.detach()] + [a.grad for a in inputs if a.is_floating_point()] + [p.grad.clone() for p in model.parameters()]


def bitwise(model, args, grad):
    replay.ENABLED = False
    ref = [outputs_of(model, args, grad) for _ in range(3)]
    replay.ENABLED = True
    before = dict(replay.counts)
    got = [outputs_of(model, args, grad) for _ in range(3)]
    delta = {k: replay.counts[k] - before[k] for k in before}
    same = all(torch.equal(a, b) for r, g in zip(ref, got) for a, b in zip(r, g))
    return same, delta


def forward_fn(model, args):
    def step() -> None:
        with torch.no_grad():
            model(*args)
    return step


def cells_of(names, dev, dt):
    cells = []
    for name in names:
        torch.manual_seed(0)
        if name in DENSE:
            act, T, H = DENSE[name]
            m = sizes.fuseops_dense(H, act).to(dev, dt)
            cells.append((f"dense {act} T={T} H={H}", m, sizes.torch_dense(m).to(dev, dt),
                          (torch.randn(T, H, device=dev, dtype=dt),)))
        else:
            shape, T = MOE[name]
            E, H, I, K = sizes.MOE_SHAPES[shape]
            m = sizes.FuseopsMoE(E, H, I).to(dev, dt)
            ids, w = sizes.routing(T, E, K, False, dev)
            cells.append((f"moe {shape} T={T}", m, sizes.TorchMoE(m).to(dev, dt),
                          (torch.randn(T, H, device=dev, dtype=dt), ids, w.to(dt))))
    return cells


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-grad", action="store_true")
    ap.add_argument("--cells", nargs="*", default=list(DENSE) + list(MOE))
    a = ap.parse_args()
    dev, dt, grad = "cuda", torch.bfloat16, not a.no_grad
    cells = cells_of(a.cells, dev, dt)
    print(f"{'training' if grad else 'inference (no_grad forward)'}")
    print(f"{'cell':28s} {'bitwise':8s} counts")
    for name, m, t, args in cells:
        same, delta = bitwise(m, args, grad)
        print(f"{name:28s} {same!s:8s} {delta}", flush=True)
    print("refusals", replay.refusals)
    print(f"{'cell':28s} {'full ms':>8s} {'replay':>8s} {'torch':>8s} {'x full':>7s} {'x torch':>7s} | "
          f"{'enq full':>8s} {'enq rep':>8s} {'enq tch':>8s}")
    for name, m, t, args in cells:
        res = {"full": [], "replay": [], "torch": []}
        enq = {"full": [], "replay": [], "torch": []}
        for _ in range(a.rounds):
            for variant in ("full", "replay", "torch"):
                replay.ENABLED = variant != "full"
                model = t if variant == "torch" else m
                step = sizes.step_fn(model, args, list(model.parameters())) if grad else forward_fn(model, args)
                res[variant].append(sizes.time_ms(step, dev, a.reps))
                enq[variant].append(sizes.enqueue_ms(step, dev, a.reps))
        replay.ENABLED = True
        f, r, tt = (min(res[v]) for v in ("full", "replay", "torch"))
        ef, er, et = (min(enq[v]) for v in ("full", "replay", "torch"))
        print(f"{name:28s} {f:8.3f} {r:8.3f} {tt:8.3f} {f / r:7.2f} {tt / r:7.2f} | {ef:8.3f} {er:8.3f} {et:8.3f}",
              flush=True)


if __name__ == "__main__":
    main()
