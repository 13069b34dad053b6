"""Timing, profiles and CUDA-graph capture shared by the benchmarks."""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch
import triton.testing
from torch.profiler import ProfilerActivity, profile

T = TypeVar("T")


def until_graphs_settle(step: Callable[[], object], sync: Callable[[], object], limit: int = 60) -> int:
    """Runs ``step`` (each followed by ``sync``, as a training loop reading its loss) until two
    steps in a row record no program and leave no graph state they call measuring or on trial
    (``graphed.settling``); the steps run. Until then programs' calls time eager runs and their
    captures sync the host (``graphed.py``): a step timed before then times the warm-up (session
    56, run 1: the offload benchmark's MoE stack without offload at 75.7 ms a step, 55.9 once
    settled). Two: a layout's first call runs the full path, and its second records the program
    whose graph state the third starts to measure. A RuntimeError after ``limit`` steps
    (``graphed.MAX_CAPTURES`` bounds a program's captures: it settles)."""
    steps = graph_settle_steps(step, sync, limit)
    if steps is None:
        from fuseops.ops.executor import graphed

        raise RuntimeError(f"the CUDA-graph states did not settle in {limit} steps: {graphed.counts}")
    return steps


def graph_settle_steps(step: Callable[[], object], sync: Callable[[], object], limit: int) -> int | None:
    """``until_graphs_settle`` for a benchmark that times the cell anyway: None, said on stdout,
    where the states had not settled after ``limit`` steps."""
    from fuseops.ops.executor import graphed, replay

    quiet = 0
    for n in range(1, limit + 1):
        since, recorded = graphed.calls(), replay.counts["recorded"]
        step()
        sync()
        settled = replay.counts["recorded"] == recorded and not graphed.settling(since)
        quiet = quiet + 1 if settled else 0
        if quiet == 2:
            return n
    print(f"  the CUDA-graph states did not settle in {limit} steps: {graphed.counts}", flush=True)
    return None


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


def sustained_ms(fn: Callable[[], object], *, warmup_s: float, steps: int,
                 before: Callable[[], object] | None = None) -> float:
    """Milliseconds per call over ``steps`` back-to-back calls, timed with events around all
    of them, after ``warmup_s`` seconds of the same calls: a training loop's steady state.
    ``before`` runs ahead of each call and is timed with it (resetting gradients, say).

    Large layers hold an H100 at its 700 W power cap, where the clocks settle at a level set
    by the work itself (1410 MHz for the MoE layer at the Mixtral shape). do_bench's few calls
    per measurement, each after an L2 flush, read that layer at 554-606 TFLOP/s in one
    session against 619 in a profiled steady state (.notes/grouped_gemm.md, session 10).
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
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / steps


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


def profiled(fn: Callable[[], object], calls: int, between: Callable[[], object] | None = None) -> cProfile.Profile:
    """A cProfile of ``calls`` calls of ``fn``; ``between`` runs before each call, unprofiled (a
    device sync: each call then starts with the device drained, as an enqueue time is taken)."""
    prof = cProfile.Profile()
    for _ in range(calls):
        if between is not None:
            between()
        prof.enable()
        fn()
        prof.disable()
    return prof


def profile_table(prof: cProfile.Profile, key: str, top: int) -> str:
    """The ``top`` rows of a cProfile by ``key`` ("tottime", "cumulative"), from its header on."""
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats(key).print_stats(top)
    body = text.getvalue()
    return body[body.find("   ncalls"):].rstrip()


def step_memory(step: Callable[[], object], reserved: bool = False) -> tuple[int, int]:
    """Bytes held between steps and the most above that during one more ``step`` (CUDA):
    allocated memory, or with ``reserved`` the memory reserved after ``torch.cuda.empty_cache()``
    (it keeps a CUDA graph's private pool whole: freed blocks there serve no other allocation)."""
    torch.cuda.synchronize()
    if reserved:
        torch.cuda.empty_cache()
    held = torch.cuda.memory_reserved if reserved else torch.cuda.memory_allocated
    peak = torch.cuda.max_memory_reserved if reserved else torch.cuda.max_memory_allocated
    between = held()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return between, peak() - between


def step_phases(model: Callable[..., torch.Tensor], args: tuple, params: list[torch.Tensor], reps: int = 30) -> str:
    """Median host microseconds of a training step's phases, the CUDA device drained before each
    step: gradients set to None, the forward, ``.sum()``, the backward (one line)."""
    phases: dict[str, list[float]] = {"grads": [], "forward": [], "sum": [], "backward": []}
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for p in params:
            p.grad = None
        t1 = time.perf_counter()
        y = model(*args)
        t2 = time.perf_counter()
        loss = y.sum()
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        for name, (a, b) in zip(phases, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
            phases[name].append((b - a) * 1e6)
        del y, loss
    return "phases (median us): " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in phases.items())


def cuda_kernel_times(step: Callable[[], object], steps: int) -> tuple[dict[str, float], dict[str, int]]:
    """Microseconds of GPU time a step by kernel name, and launches a step, over ``steps`` calls
    of ``step`` under torch.profiler (CUDA activity only; warm up before)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    launches: dict[str, int] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name] = times.get(e.name, 0.0) + e.device_time / steps
            launches[e.name] = launches.get(e.name, 0) + 1
    return times, {k: v // steps for k, v in launches.items()}
