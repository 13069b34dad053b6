"""Timing and CUDA-graph capture shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch
import triton.testing

T = TypeVar("T")


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int = 3, *, warmup: int = 25,
                        rep: int = 100) -> dict[str, float]:
    """Milliseconds per call of each function: the median over ``rounds`` rounds that time
    every function in turn (the H100's clocks drift with power over seconds, so a side timed
    all at once can land on a slower stretch than the other)."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    return {name: sorted(ts)[rounds // 2] for name, ts in times.items()}


def elapsed_ms(fn: Callable[[], object], device: str = "cuda") -> float:
    """Milliseconds of ``fn`` between two CUDA events recorded around it (the GPU's time for what
    ``fn`` queues, from where the stream stands; nothing is drained first), or wall time off the GPU."""
    if device != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end)


def sustained_ms(fn: Callable[[], object], *, warmup_s: float, steps: int,
                 before: Callable[[], object] | None = None) -> float:
    """Milliseconds per call over ``steps`` back-to-back calls, timed with events around all
    of them, after ``warmup_s`` seconds of the same calls: a training loop's steady state.
    ``before`` runs ahead of each call and is timed with it (resetting gradients, say).

    Large layers hold an H100 at its 700 W power cap, where the clocks settle at a level set
    by the work itself (1410 MHz for the MoE layer at the Mixtral shape): do_bench's few calls
    per measurement, each after an L2 flush, land somewhere on that slope. For the MoE layer the
    two methods agree within ~1 % (``python -m benchmarks.moe_layer --timing sustained`` against
    ``--timing do_bench``, H100).
    """

    def step() -> None:
        if before is not None:
            before()
        fn()

    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        step()
        # Else the host queues far more than warmup_s of work before the loop ends.
        torch.cuda.synchronize()
    return elapsed_ms(lambda: [step() for _ in range(steps)]) / steps


def capture_cuda_graph(step: Callable[[], T], warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, T]:
    """``step`` run ``warmup`` times on a side stream (lazy allocations and compiles happen
    outside the capture), then captured: ``(graph, what the captured call returned)``, whose
    tensors the graph's replays overwrite."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out
