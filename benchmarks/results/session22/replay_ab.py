"""Replayed plan runs (issue 20) against the full path, one process, interleaved: dense stacks and
MoE layers from ``benchmarks.sizes``, bf16 fwd+bwd. First a bitwise check (outputs and every
gradient over three calls, replay on and off), then step and enqueue ms in alternating rounds.

    python benchmarks/results/session22/replay_ab.py [--reps 30] [--rounds 3]
"""
import argparse

import torch

from benchmarks import sizes
from fuseops.ops.executor import replay


def grads_of(model, args):
    for p in model.parameters():
        p.grad = None
    inputs = [a.detach().clone().requires_grad_() if a.is_floating_point() else a for a in args]
    y = model(*inputs)
    y.float().square().sum().backward()
    return [y.detach()] + [a.grad for a in inputs if a.is_floating_point()] + [p.grad.clone() for p in model.parameters()]


def bitwise(model, args):
    replay.ENABLED = False
    ref = [grads_of(model, args) for _ in range(3)]
    replay.ENABLED = True
    before = dict(replay.counts)
    got = [grads_of(model, args) for _ in range(3)]
    delta = {k: replay.counts[k] - before[k] for k in before}
    same = all(torch.equal(a, b) for r, g in zip(ref, got) for a, b in zip(r, g))
    return same, delta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    cells = []
    for act, T, H in [("gelu", 1024, 1024), ("gelu", 4096, 1024), ("swiglu", 1024, 1024), ("gelu", 4096, 2048)]:
        torch.manual_seed(0)
        m = sizes.fuseops_dense(H, act).to(dev, dt)
        cells.append((f"dense {act} T={T} H={H}", m, sizes.torch_dense(m).to(dev, dt), (torch.randn(T, H, device=dev, dtype=dt),)))
    for shape, T in [("qwen3", 1024), ("olmoe", 1024), ("qwen3", 4096)]:
        E, H, I, K = sizes.MOE_SHAPES[shape]
        torch.manual_seed(0)
        m = sizes.FuseopsMoE(E, H, I).to(dev, dt)
        ids, w = sizes.routing(T, E, K, False, dev)
        args = (torch.randn(T, H, device=dev, dtype=dt), ids, w.to(dt))
        cells.append((f"moe {shape} T={T}", m, sizes.TorchMoE(m).to(dev, dt), args))
    print(f"{'cell':28s} {'bitwise':8s} counts")
    for name, m, t, args in cells:
        same, delta = bitwise(m, args)
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
                step = sizes.step_fn(model, args, list(model.parameters()))
                res[variant].append(sizes.time_ms(step, dev, a.reps))
                enq[variant].append(sizes.enqueue_ms(step, dev, a.reps))
        replay.ENABLED = True
        f, r, tt = (min(res[v]) for v in ("full", "replay", "torch"))
        ef, er, et = (min(enq[v]) for v in ("full", "replay", "torch"))
        print(f"{name:28s} {f:8.3f} {r:8.3f} {tt:8.3f} {f / r:7.2f} {tt / r:7.2f} | {ef:8.3f} {er:8.3f} {et:8.3f}",
              flush=True)


if __name__ == "__main__":
    main()
