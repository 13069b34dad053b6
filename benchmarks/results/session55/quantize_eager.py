"""Session 55 probe, for the next device session: why `benchmarks.quantize` times FP8 blockwise with the column-wise
copy at 0.26 ms eager against 0.115 ms replayed from a CUDA graph (bf16 [16384, 4096], run 5; the row-wise cast 0.079
either way, MXFP8 with the column-wise copy 0.134 / 0.117). Per case: the host time of one call with the GPU kept
busy (a spin queued first, so no call waits on the GPU), and the GPU time of back-to-back calls (CUDA events over 50
calls, no L2 flush) against the same calls replayed from one graph.

    python benchmarks/results/session55/quantize_eager.py
"""
import statistics
import time

import torch

from benchmarks._timing import capture_cuda_graph
from fuseops import recipes
from fuseops.quant import quantize

CASES = {
    "fp8_blockwise": (recipes.FP8Blockwise(), (False, True)),
    "mxfp8": (recipes.MXFP8(), (False, True)),
    "fp8_current": (recipes.FP8CurrentScaling(), (False, True)),
}


def host_us(fn, reps: int = 50) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(5_000_000)
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def gpu_us(fn, calls: int = 50) -> tuple[float, float]:
    """Per call: back-to-back eager calls, and the same calls replayed from one CUDA graph."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    eager = begin.elapsed_time(end) * 1e3 / calls
    graph, _ = capture_cuda_graph(lambda: [fn() for _ in range(calls)])
    graph.replay()
    torch.cuda.synchronize()
    begin.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return eager, begin.elapsed_time(end) * 1e3 / calls


def main() -> None:
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    for name, (recipe, columnwise_cases) in CASES.items():
        for columnwise in columnwise_cases:
            def fn(recipe=recipe, columnwise=columnwise):
                return quantize(x, recipe, role="input", columnwise=columnwise)
            for _ in range(5):
                fn()
            h = host_us(fn)
            eager, graph = gpu_us(fn)
            print(f"{name:14} columnwise={columnwise!s:5}  host {h:7.1f} us  GPU back-to-back {eager:7.1f} us a call, "
                  f"graph {graph:7.1f}", flush=True)


if __name__ == "__main__":
    main()
