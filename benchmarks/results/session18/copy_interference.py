"""Session 18 diagnostic (issue 23): do device-to-host copies on a side stream slow the
compute they overlap? The moe and mlp stacks' forward and backward without offload, alone and
with D2H copies of N bytes (pinned, 64 MiB pieces) issued on a side stream at the forward's
start (and H2D copies at the backward's start), interleaved rounds, the fastest of each.
    python benchmarks/results/session18/copy_interference.py
"""
import functools
import statistics
import sys

import torch
from torch import nn

sys.path.insert(0, ".")
from benchmarks import offload as bo

PIECE = 64 * 2**20


def copy_on_side(side, pairs):
    """``dst.copy_(src)`` for each (dst, src) on ``side``, after the work queued so far."""
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for dst, src in pairs:
            dst.copy_(src, non_blocking=True)


def step_ms(layers, x, side, pairs, copies):
    """Forward and backward ms of one step; with ``copies``, the (device, pinned) ``pairs``
    copied to the host on ``side`` as the forward starts and back as the backward starts."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    torch.cuda.synchronize()
    ev[0].record()
    if copies:
        copy_on_side(side, [(pinned, dev) for dev, pinned in pairs])
    loss = bo._forward(layers, x)
    ev[1].record()
    if copies:
        copy_on_side(side, pairs)
    loss.backward()
    ev[2].record()
    torch.cuda.synchronize()
    return ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2])


def main():
    dev, dt = torch.device("cuda"), torch.bfloat16
    side = torch.cuda.Stream()
    for kind, gb in (("moe", 0.77), ("mlp", 1.14)):
        torch.manual_seed(0)
        layers = nn.ModuleList(bo.STACKS[kind](4096) for _ in range(8)).to(dev, dt)
        x = torch.randn(1, 8192, 4096, device=dev, dtype=dt)
        n = int(gb * 1e9) // PIECE
        srcs = [torch.empty(PIECE, dtype=torch.uint8, device=dev) for _ in range(n)]
        dsts = [torch.empty(PIECE, dtype=torch.uint8, pin_memory=True) for _ in range(n)]

        pairs = list(zip(srcs, dsts))
        one = functools.partial(step_ms, layers, x, side, pairs)
        for _ in range(3):
            one(False), one(True)
        best = {False: (1e9, 1e9), True: (1e9, 1e9)}
        for _ in range(5):
            for c in (False, True):
                rows = [one(c) for _ in range(6)]
                f, b = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
                best[c] = min(best[c], (f, b), key=sum)
        (f0, b0), (f1, b1) = best[False], best[True]
        print(f"{kind}: {n * PIECE / 1e9:.2f} GB each way; fwd {f0:.2f} -> {f1:.2f} ms ({f1 / f0:.3f}), "
              f"bwd {b0:.2f} -> {b1:.2f} ({b1 / b0:.3f}), step {(f1 + b1) / (f0 + b0):.3f}")


if __name__ == "__main__":
    main()
