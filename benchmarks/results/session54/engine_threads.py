"""Session 54 probe, for the next device session: what the autograd engine's device thread costs a step's host.
Run 4 saw the MoE composition's drained step host at 1.05-1.12 ms with the engine's CUDA device thread running the
backward and 0.72 ms on the calling thread (``torch.autograd.set_multithreading_enabled(False)``), from three steps
each. Here, per model (the composition, ``expert_layer``, the torch MoE, the GELU dense stack fuseops and torch), the
drained step's host time and its phases, with the engine's threads on and off in alternating blocks of one process.

    python benchmarks/results/session54/engine_threads.py [--T 1024] [--blocks 6] [--reps 30]
"""
import argparse
import statistics

import torch

from benchmarks._timing import step_phases
from benchmarks.sizes import (
    MOE_SHAPES,
    FuseopsExpertLayer,
    FuseopsMoE,
    TorchMoE,
    dense_cell,
    enqueue_ms,
    moe_args,
    step_fn,
    time_ms,
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--device", default="cuda", help="cpu: a smoke test (tiny shapes, float32)")
    a = p.parse_args()
    dev = a.device
    E, H, I, K = MOE_SHAPES["qwen3"] if dev == "cuda" else (4, 32, 16, 2)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    moe = FuseopsMoE(E, H, I).to(dev, dtype)
    torch_moe = TorchMoE(moe).to(dev, dtype)
    args = moe_args(a.T, E, H, K, device=dev, dtype=dtype)
    dense, dense_ref, x = dense_cell(f"gelu:{a.T}:{2048 if dev == 'cuda' else 32}", dev, dtype)
    runs = {"composition": (moe, args, list(moe.parameters())),
            "expert_layer": (FuseopsExpertLayer(moe), args, list(moe.parameters())),
            "torch moe": (torch_moe, args, list(torch_moe.parameters())),
            "fuseops dense": (dense, (x,), list(dense.parameters())),
            "torch dense": (dense_ref, (x,), list(dense_ref.parameters()))}
    steps = {name: step_fn(*run) for name, run in runs.items()}
    for step in steps.values():
        for _ in range(40):
            step()
    got: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for block in range(a.blocks):
        threads = block % 2 == 0
        torch.autograd.set_multithreading_enabled(threads)
        for name, step in steps.items():
            for _ in range(5):
                step()
            got.setdefault((name, threads), []).append((time_ms(step, dev, a.reps), enqueue_ms(step, dev, a.reps)))
    for name in steps:
        line = []
        for threads in (True, False):
            torch.autograd.set_multithreading_enabled(threads)
            ms = statistics.median(s for s, _ in got[name, threads])
            host = statistics.median(h for _, h in got[name, threads])
            phases = step_phases(*runs[name]) if dev == "cuda" else ""
            line.append(f"threads={threads}: step {ms:.3f} ms host {host:.3f} ms {phases}")
        print(f"T={a.T} {name:14}", " | ".join(line), flush=True)
    torch.autograd.set_multithreading_enabled(True)


if __name__ == "__main__":
    main()
