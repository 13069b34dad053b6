"""What ``benchmarks/expert_parallel.py`` prints beside each row: the link measured in the same run
(an ``all_to_all_single`` sweep, the slowest rank's median per size), the bound it sets (the
one-GPU layer's step plus the step's four exchanges at that speed, nothing hidden) and the cost
model's prediction for the row's exchange (``benchmarks/ep_cost_model.py``, fed this run's sweep,
HBM copy speed and one-GPU compute)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from benchmarks import ep_cost_model as cm
from benchmarks._ep_layers import CAPACITY, EXACT, GRAPHED, OVERLAP, TORCH_EP

# Bytes of each rank's tensor; the smoke run's stay small.
SWEEP_BYTES = (16 * 2**20, 64 * 2**20, 256 * 2**20, 2**30)
SMOKE_SWEEP_BYTES = (2**12, 2**16)
SWEEP_WARMUP, SWEEP_STEPS = 2, 5


def _slowest(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _timed(fn, device: torch.device, steps: int) -> float:
    """Median seconds of ``fn`` over ``steps`` calls, each between a barrier and the device drained."""
    times = []
    for _ in range(steps):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    times = sorted(_slowest(times, device))
    return times[len(times) // 2]


def link_sweep(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...]) -> list[tuple[int, float]]:
    """(bytes of each rank's tensor, seconds) of an equal-split ``all_to_all_single``."""
    out = []
    for size in sizes:
        send = torch.ones(size // torch.finfo(dtype).bits * 8, dtype=dtype, device=device)
        recv = torch.empty_like(send)
        for _ in range(SWEEP_WARMUP):
            dist.all_to_all_single(recv, send)
        out.append((size, _timed(lambda: dist.all_to_all_single(recv, send), device, SWEEP_STEPS)))
        del send, recv
    return out


def copy_bytes_per_s(device: torch.device, size: int) -> float:
    """Bytes read plus written per second by a device copy of ``size`` bytes (the weight
    gradient's sum over pieces moves at this speed)."""
    src = torch.ones(size // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * size / _timed(lambda: dst.copy_(src), device, SWEEP_STEPS)


def _prediction(impl: str, shape: cm.Shape, world: int, compute: cm.Compute, link: cm.Link, hbm: float,
                capacity: int | None) -> cm.Prediction | None:
    kw = {"hbm_bytes_per_s": hbm}
    if impl in (TORCH_EP, EXACT):
        return cm.predict(shape, world, compute, link, **kw)
    if impl.startswith(OVERLAP + "="):
        return cm.predict(shape, world, compute, link, pieces=int(impl.split("=")[1]), **kw)
    if capacity is None:
        return None
    if impl in (CAPACITY, GRAPHED):
        return cm.predict(shape, world, compute, link, rows=world * capacity, **kw)
    if impl.startswith("fuseops EP chunks="):
        return cm.predict(shape, world, compute, link, pieces=int(impl.split("=")[1]), own_first=False,
                          rows=world * capacity, **kw)
    return None


def annotate(rows: list[dict], layer_shape: tuple[int, int, int, int], element_bytes: int, world: int,
             sweep: list[tuple[int, float]], hbm: float, reference: str) -> None:
    """Adds ``link_ms`` (the step's four exchanges at the swept speed), ``bound_ms`` (the
    one-GPU step plus ``link_ms``) and ``model_ms`` (the cost model's step) to each EP row, in
    place; the model's compute comes from the one-GPU rows (two token counts give the per-expert
    cost; one gives a cost per row alone)."""
    num_experts, hidden, ffn, top_k = layer_shape
    ref = {r["tokens_per_gpu"]: r for r in rows if r["impl"] == reference}
    if world < 2 or not ref:
        return
    link = cm.Link(tuple(sweep), world)
    base = cm.Shape(0, top_k, hidden, ffn, num_experts, element_bytes)
    steps = {t: r["ms"] / 1e3 for t, r in ref.items()}
    forwards = {t: r["forward_ms"] / 1e3 for t, r in ref.items() if r.get("forward_ms")}
    compute = cm.Compute.from_one_gpu(base, steps, forward_s=forwards if len(forwards) == len(steps) else None)
    for r in rows:
        if "EP" not in r["impl"]:
            continue
        shape = cm.Shape(r["tokens_per_gpu"], top_k, hidden, ffn, num_experts, element_bytes)
        one = cm.exchange_seconds(shape, world, link, r.get("capacity") and world * r["capacity"])
        r["link_ms"] = 4 * one * 1e3
        r["bound_ms"] = ref[r["tokens_per_gpu"]]["ms"] + r["link_ms"]
        p = _prediction(r["impl"], shape, world, compute, link, hbm, r.get("capacity"))
        r["model_ms"] = None if p is None else p.step_s * 1e3
