"""Timing and CUDA-graph capture shared by the benchmarks."""

from __future__ import annotations

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
