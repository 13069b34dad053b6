"""The MoE expert layer under expert parallelism (EP) on NCCL, one process per GPU, against the same
layer on one GPU and against plain torch EP: the Qwen3-30B-A3B experts (E=128, H=2048, I=768 per
expert, top-8, SwiGLU), bf16, forward+backward, each rank with its own tokens and E/P experts.

The EP layer on every rank: ``permute`` -> exchange -> the local experts (``Sequential`` of
``GroupedLinear``, ``SwiGLU``, ``GroupedLinear`` over E/P experts) -> ``combine`` -> ``unpermute``. Rows:

- ``one-GPU`` (the reference): ``permute`` -> all E experts -> ``unpermute``, the same tokens per GPU,
  no exchange (every rank runs it alone); ``one-GPU expert_layer``: ``fuseops.moe.expert_layer``.
- ``torch EP``: the counts exchanged by ``all_to_all_single`` and read on the host, the rows by a
  variable-size ``all_to_all_single`` (an autograd Function), ``torch._grouped_mm`` experts, back.
- ``fuseops EP exact``: ``dispatch`` (one host read of the counts a step).
- ``fuseops EP overlap=k``: ``dispatch_chunks`` without capacity: the experts start on the rows this
  rank routes to its own experts while the remote rows travel in k pieces; the outputs go to
  ``combine`` by a generator, each piece's return starting as it comes (the backward mirrors it).
- ``fuseops EP capacity``: ``dispatch(capacity=expert_capacity(T, K, P, --capacity-factor),
  on_overflow="drop")``, no host read; "drop" as the default "error"'s device assert would end the
  run on the first step that overflows. The rows dropped (``handle.dropped``) are reported.
- ``fuseops EP chunks=k``: ``dispatch_chunks`` at that capacity, the outputs handed to ``combine`` by a
  generator (experts on a chunk while the others travel, both ways).
- ``fuseops EP capacity, graphed``: the capacity step captured in a ``torch.cuda.CUDAGraph`` on static
  inputs, each replay after its step's routing is copied in.

Routing: top-K of random logits (``--skewed``: every even-numbered token's top-1 then goes to expert 0,
as in ``benchmarks/moe_layer.py``); each step copies the next of three routings in. Timing: 3 warm-up
steps, then 20 steps each between two CUDA events; a step takes the slowest rank's time, a row the
median over steps. Peak memory: over one step above its start (graphed: over warm-up and capture), the
largest rank. Each row's output and gradients (input, router weights, this rank's experts' weights) are
compared with the one-GPU layer's. Before the rows, an ``all_to_all_single`` sweep (16 MiB to 1 GiB per
rank) measures the link and a device copy the HBM; each EP row prints beside the bound the link sets
(the one-GPU step plus the step's four exchanges at the swept speed) and the step that
``benchmarks/ep_cost_model.py`` predicts from this run's sweep and one-GPU rows. The targets, met or
missed, print after the table.

    python -m benchmarks.expert_parallel                    # every visible GPU (2, 4 or 8)
    python -m benchmarks.expert_parallel --world-size 2 --skewed
    torchrun --nproc-per-node 4 -m benchmarks.expert_parallel
    python -m benchmarks.expert_parallel --smoke            # 2 gloo ranks on the CPU, tiny, float32

Writes ``benchmarks/results/expert_parallel-x<P>[-skewed]-<gpu>-<date>.json`` and ``.png`` (runs on 2, 4
and 8 GPUs keep their own files); prints a table last. ``--smoke`` runs all but the graphed row at E=4,
H=16, I=8, K=2, 32 tokens per rank (capacity factor P: nothing drops) and exits 1 unless every EP
output and gradient equals the one-GPU layer's and plain torch EP's within float32 tolerance.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from benchmarks._ep_layers import (
    CAPACITY,
    EXACT,
    GRAPHED,
    OVERLAP,
    REFERENCE,
    TORCH_EP,
    Layer,
    implementations,
    make_layer,
)
from benchmarks._ep_link import SMOKE_SWEEP_BYTES, SWEEP_BYTES, annotate, copy_bytes_per_s, link_sweep
from benchmarks._results import PEAK_CONVENTION, RESULTS, pyplot, results_path
from fuseops.moe import expert_capacity

# (E, H, I, K): Qwen3-30B-A3B's routed experts; the smoke run's tiny layer.
QWEN3 = (128, 2048, 768, 8)
SMOKE_SHAPE = (4, 16, 8, 2)
TOKENS = (8192, 2048)
SMOKE_TOKENS = 32
WARMUP, STEPS = 3, 20
SMOKE_WARMUP, SMOKE_STEPS = 1, 3
CAPACITY_FACTOR = 1.25
CHUNKS = (2, 4)
# The overlapped exact rows: the remote rows in this many pieces.
PIECES = (1, 2)
# Targets at 8192 tokens per GPU: the exact step <= 1.6x the one-GPU layer's (1.8x with skewed
# routing), the overlapped one <= 1.3x, every fuseops EP row >= 1.5x as fast as plain torch EP; at
# 2048, the graphed capacity step <= 1.2x the one-GPU layer's.
EXACT_MAX, SKEWED_EXACT_MAX, OVERLAP_MAX, TORCH_EP_MIN, GRAPH_MAX = 1.6, 1.8, 1.3, 1.5, 1.2
EP_TOKENS, GRAPH_TOKENS = 8192, 2048
# The largest relative error (by norm) against the one-GPU layer that counts as agreeing: bf16
# layers summing in different orders differ by a few 1e-3; float32 ones (the smoke run) by ~1e-7.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-5}
# A rank that fails while its peers wait in a collective turns into an error, not a hang. On GPUs
# a peer may spend minutes compiling Triton kernels before its collective.
COLLECTIVE_TIMEOUT_S = {"cpu": 120, "cuda": 900}


def eager_step(layer: Layer, forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    def step() -> torch.Tensor:
        for t in layer.leaves():
            t.grad = None
        y = forward()
        y.backward(layer.dy)
        return y

    return step


def graphed_step(layer: Layer, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``step`` captured in a CUDA graph after 2 steps on a side stream (compiles, the communicator
    and lazy allocations happen outside the capture); the replay reads the layer's routing tensors,
    writes the captured output and the leaves' gradients."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(2):
            layer.route(i)
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: NCCL's watchdog thread queries events while the capture runs.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        y = step()

    def replay() -> torch.Tensor:
        graph.replay()
        return y

    return replay


def graph_with_peak(layer: Layer, eager: Callable[[], torch.Tensor]) -> tuple[Callable[[], torch.Tensor], float, float]:
    """``graphed_step`` of ``eager``, and the peak memory over its warm-up and capture."""
    built = []
    peak, reserved = peak_gb(layer.x.device, lambda: built.append(graphed_step(layer, eager)))
    return built[0], peak, reserved


def _all_max(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _sync(device: torch.device) -> None:
    """Every rank here, its device drained."""
    _all_max([0.0], device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_ms(layer: Layer, step: Callable[[], torch.Tensor], warmup: int, steps: int) -> float:
    """The median over ``steps`` of the slowest rank's step (CUDA events; wall time on the CPU),
    after ``warmup`` steps; each step copies in its routing first."""
    device = layer.x.device
    for i in range(warmup):
        layer.route(i)
        step()
    _sync(device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for i, (begin, end) in enumerate(events):
            begin.record()
            layer.route(warmup + i)
            step()
            end.record()
        torch.cuda.synchronize(device)
        times = [begin.elapsed_time(end) for begin, end in events]
    else:
        times = []
        for i in range(steps):
            start = time.perf_counter()
            layer.route(warmup + i)
            step()
            times.append((time.perf_counter() - start) * 1e3)
    slowest = sorted(_all_max(times, device))
    return slowest[len(slowest) // 2]


def peak_gb(device: torch.device, fn: Callable[[], object]) -> tuple[float, float]:
    """The largest over the ranks of the peak memory above the start of ``fn``, allocated and
    reserved (GB); zeros off the GPU."""
    if device.type != "cuda":
        fn()
        return 0.0, 0.0
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    fn()
    torch.cuda.synchronize(device)
    peaks = [(torch.cuda.max_memory_allocated(device) - allocated) / 1e9,
             (torch.cuda.max_memory_reserved(device) - reserved) / 1e9]
    return tuple(_all_max(peaks, device))


def outputs(layer: Layer, step: Callable[[], torch.Tensor], expert_parallel: bool) -> dict[str, torch.Tensor]:
    """One step on routing 0: the output and gradients that every row must agree on; the experts'
    weight gradients are this rank's experts', summed over every rank's tokens."""
    layer.route(0)
    y = step()
    if expert_parallel:
        dw1, dw2 = layer.local[0].weight.grad.clone(), layer.local[2].weight.grad.clone()
    else:
        summed = []
        for w in (layer.full[0].weight, layer.full[2].weight):
            g = w.grad.clone()
            dist.all_reduce(g)
            summed.append(g[layer.mine].clone())
        dw1, dw2 = summed
    return {"y": y.detach().clone(), "dx": layer.x.grad.clone(), "dweights": layer.weights.grad.clone(),
            "dw1": dw1, "dw2": dw2}


def max_rel_err(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], device: torch.device) -> float:
    """The largest relative error (by norm) over the output and gradients, and over the ranks."""
    errs = [((got[k].double() - want[k].double()).norm() / want[k].double().norm().clamp(min=1e-30)).item()
            for k in want]
    return _all_max([max(errs)], device)[0]


def dropped_rows(layer: Layer, device: torch.device) -> int | None:
    """Rows the last capacity exchange dropped, summed over the ranks (None for the exact one)."""
    dropped = getattr(layer.handle, "dropped", None)
    if dropped is None:
        return None
    t = dropped.detach().to(device=device, dtype=torch.int64).reshape(1).clone()
    dist.all_reduce(t)
    return int(t.item())


def log(start: float, message: str) -> None:
    if dist.get_rank() == 0:
        print(f"[{time.time() - start:6.0f} s] {message}", flush=True)


def measure_tokens(tokens: int, args, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device,
                   start: float) -> list[dict]:
    """Every row at one token count per GPU."""
    world = dist.get_world_size()
    top_k = shape[3]
    layer = make_layer(tokens, shape, dtype, device, args.skewed)
    capacity = expert_capacity(tokens, top_k, world, capacity_factor=args.capacity_factor)
    impls = {n: f for n, f in implementations(layer, capacity, tuple(args.chunks), tuple(args.pieces)).items()
             if n in (REFERENCE, TORCH_EP) or n.split("=")[0] in args.impls}
    steps = {name: eager_step(layer, forward) for name, forward in impls.items()}
    warmup, timed = (SMOKE_WARMUP, SMOKE_STEPS) if args.smoke else (args.warmup, args.steps)
    if device.type == "cuda" and GRAPHED in args.impls and CAPACITY in steps:
        steps[GRAPHED] = None
    rows, ref, torch_out = [], None, None
    for name, step in steps.items():
        layer.handle = None
        if name == GRAPHED:
            step, peak, reserved = graph_with_peak(layer, steps[CAPACITY])
        else:
            # A first step outside the memory peak: Triton compiles and lazy allocations.
            layer.route(0)
            step()
            # As PEAK_CONVENTION counts: the step's gradient buffers are allocated inside it.
            for t in layer.leaves():
                t.grad = None
            peak, reserved = peak_gb(device, step)
        out = outputs(layer, step, expert_parallel="EP" in name)
        dropped = dropped_rows(layer, device)
        if name == REFERENCE:
            ref = out
        if name == TORCH_EP:
            torch_out = out
        err = max_rel_err(out, ref, device)
        err_torch = max_rel_err(out, torch_out, device) if name.startswith("fuseops EP") else None
        del out
        ms = step_ms(layer, step, warmup, timed)
        # The one-GPU forward alone: the cost model's split of the experts' compute.
        forward_ms = step_ms(layer, impls[name], warmup, timed) if name == REFERENCE else None
        row = {"impl": name, "tokens_per_gpu": tokens, "ms": ms, "forward_ms": forward_ms, "peak_above_start_gb": peak,
               "reserved_above_start_gb": reserved, "rel_err_vs_one_gpu": err, "rel_err_vs_torch_ep": err_torch,
               "agrees": err <= TOLERANCE[dtype], "dropped_rows": dropped, "rows_per_step": world * tokens * top_k}
        if "capacity" in name or "chunks" in name:
            row["capacity"] = capacity
        rows.append(row)
        vs_torch = "" if err_torch is None else f", vs torch EP {err_torch:.1e}"
        drops = "" if dropped is None else f", dropped {dropped} of {world * tokens * top_k} rows"
        log(start, f"{tokens} tokens/GPU {name}: {ms:.2f} ms, peak above start {peak:.2f} GB, "
                   f"max rel err vs one-GPU {err:.1e}{vs_torch}{drops}")
        for t in layer.leaves():
            t.grad = None
    ref_ms = rows[0]["ms"]
    torch_ms = next(r["ms"] for r in rows if r["impl"] == TORCH_EP)
    for row in rows:
        row["x_one_gpu"] = row["ms"] / ref_ms
        row["speedup_vs_torch_ep"] = torch_ms / row["ms"]
    return rows


def _goal(target: str, impl: str | None, tokens: int, value: float | None, bound: str, met: bool | None,
          agrees: bool = True) -> dict:
    return {"target": target, "impl": impl, "tokens_per_gpu": tokens, "value": value, "bound": bound, "met": met,
            "agrees": agrees}


def targets(rows: list[dict], ep_tokens: int, graph_tokens: int, skewed: bool = False) -> list[dict]:
    """Each target, per fuseops EP row that it applies to: the value, the bound, met or not
    (``met`` None where nothing was measured)."""
    by = {(r["impl"], r["tokens_per_gpu"]): r for r in rows}
    out = []
    ep_rows = [r for r in rows if r["tokens_per_gpu"] == ep_tokens and r["impl"].startswith("fuseops EP")
               and r["impl"] != GRAPHED]
    for r in ep_rows:
        ratio, speedup = r["x_one_gpu"], r["speedup_vs_torch_ep"]
        bound = (SKEWED_EXACT_MAX if skewed else EXACT_MAX) if r["impl"] == EXACT else \
            OVERLAP_MAX if r["impl"].startswith(OVERLAP) else None
        if bound is not None:
            out.append(_goal("ep_vs_one_gpu", r["impl"], ep_tokens, ratio, f"<= {bound}", ratio <= bound, r["agrees"]))
        out.append(_goal("ep_vs_torch_ep", r["impl"], ep_tokens, speedup, f">= {TORCH_EP_MIN}",
                         speedup >= TORCH_EP_MIN, r["agrees"]))
    if not ep_rows:
        out.append(_goal("ep_vs_one_gpu", None, ep_tokens, None, f"<= {EXACT_MAX}", None))
    graph = by.get((GRAPHED, graph_tokens))
    ratio = graph["x_one_gpu"] if graph else None
    out.append(_goal("graph_vs_one_gpu", GRAPHED, graph_tokens, ratio, f"<= {GRAPH_MAX}",
                     None if ratio is None else ratio <= GRAPH_MAX, graph is None or graph["agrees"]))
    return out


def print_table(meta: dict, rows: list[dict], goals: list[dict]) -> None:
    E, H, I, K = meta["shape"]
    print(f"\nExpert-parallel MoE layer (E={E}, H={H}, I={I} per expert, top-{K}, SwiGLU), {meta['dtype']}, "
          f"forward+backward on {meta['world_size']} ranks ({meta['backend']}, {meta['device']}), "
          f"{meta['routing']} routing")
    print(f"ms: median over {meta['steps']} steps of the slowest rank's step, after {meta['warmup']} warm-up steps; "
          "x one-GPU: time over the one-GPU layer's (all E experts, same tokens per GPU);")
    print("vs torch EP: plain torch EP's time over this one; peak: above the step's start, GB, largest rank; "
          f"capacity factor {meta['capacity_factor']}")
    print("link: the step's four exchanges at the speed this run's all-to-all sweep measured; bound: the one-GPU "
          "step plus link (nothing hidden); model: benchmarks/ep_cost_model.py's step from this run's sweep")
    head = (f"{'impl':<30}{'tokens/GPU':>11}{'ms':>9}{'x one-GPU':>11}{'vs torch EP':>13}{'link':>7}{'bound':>8}"
            f"{'model':>8}{'peak':>8}{'reserved':>10}{'rel err':>9}{'dropped':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        dropped = "" if r["dropped_rows"] is None else f"{r['dropped_rows'] / r['rows_per_step']:.1%}"
        mark = "" if r["agrees"] else "  differs from the one-GPU layer" + (
            ": dropped rows add zero" if r["dropped_rows"] else "")
        link, bound, model = (("" if r.get(k) is None else f"{r[k]:.2f}") for k in ("link_ms", "bound_ms", "model_ms"))
        print(f"{r['impl']:<30}{r['tokens_per_gpu']:>11}{r['ms']:>9.2f}{r['x_one_gpu']:>11.2f}"
              f"{r['speedup_vs_torch_ep']:>13.2f}{link:>7}{bound:>8}{model:>8}"
              f"{r['peak_above_start_gb']:>8.2f}{r['reserved_above_start_gb']:>10.2f}"
              f"{r['rel_err_vs_one_gpu']:>9.1e}{dropped:>9}{mark}")
    print()
    if meta["backend"] == "gloo":
        print("(a CPU run: the targets below are for H200s over NCCL; here they only show the report)")
    words = {"ep_vs_one_gpu": "time over the one-GPU layer's", "ep_vs_torch_ep": "speedup over plain torch EP",
             "graph_vs_one_gpu": "graphed step over the one-GPU layer's"}
    for g in goals:
        state = "not measured" if g["met"] is None else "met" if g["met"] else "MISSED"
        value = "" if g["value"] is None else f"{g['value']:.2f} "
        differs = "" if g["agrees"] else " (its output differs from the one-GPU layer's: see the table)"
        print(f"target {g['target']} at {g['tokens_per_gpu']} tokens/GPU, {g['impl'] or 'fuseops EP'}: "
              f"{words[g['target']]} {value}({g['bound']}): {state}{differs}")


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    token_counts = list(dict.fromkeys(r["tokens_per_gpu"] for r in rows))
    fig, axes = plt.subplots(1, len(token_counts), figsize=(6 * len(token_counts), 5), squeeze=False)
    for ax, tokens in zip(axes[0], token_counts):
        got = [r for r in rows if r["tokens_per_gpu"] == tokens]
        ax.barh([r["impl"] for r in got], [r["ms"] for r in got],
                color=["tab:gray" if "EP" not in r["impl"] else "tab:orange" if "torch" in r["impl"] else "tab:blue"
                       for r in got])
        ax.axvline(got[0]["ms"] * EXACT_MAX, color="k", linestyle="--", label=f"{EXACT_MAX}x one-GPU")
        ax.invert_yaxis()
        ax.set_xlabel("ms per forward+backward (slowest rank, median)")
        ax.set_title(f"{tokens} tokens per GPU")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args, device: torch.device) -> bool:
    """Every row on this rank; rank 0 writes the results and prints the table. True unless the
    smoke run's outputs disagree."""
    start = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    shape, dtype = (SMOKE_SHAPE, torch.float32) if args.smoke else (QWEN3, torch.bfloat16)
    if shape[0] % world:
        raise SystemExit(f"--world-size: expected a divisor of the {shape[0]} experts, got {world}")
    if args.smoke:
        # Nothing drops: the capacity rows must equal the exact ones.
        args.capacity_factor = float(world)
    token_counts = (SMOKE_TOKENS,) if args.smoke else tuple(args.tokens)
    meta = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": dist.get_backend(), "world_size": world, "shape": list(shape),
        "dtype": str(dtype).removeprefix("torch."), "routing": "skewed" if args.skewed else "uniform",
        "capacity_factor": args.capacity_factor, "on_overflow": "drop",
        "warmup": SMOKE_WARMUP if args.smoke else args.warmup, "steps": SMOKE_STEPS if args.smoke else args.steps,
        "tolerance": TOLERANCE[dtype], "torch": torch.__version__, "peak": PEAK_CONVENTION,
    }
    try:
        meta["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass
    name = f"expert_parallel-x{world}" + ("-skewed" if args.skewed else "")
    out_dir = args.out_dir or (Path(tempfile.gettempdir()) if args.smoke else RESULTS)
    path = results_path(name, "", device=device.type, directory=out_dir)
    ep_tokens, graph_tokens = (token_counts[0],) * 2 if args.smoke else (EP_TOKENS, GRAPH_TOKENS)
    log(start, f"{world} ranks, {meta['backend']}, {meta['device']}, E/H/I/K {shape}, {meta['dtype']}, "
               f"{meta['routing']} routing, tokens per GPU {token_counts}")
    # The link and HBM of this run: every row is printed beside the bound they set.
    sweep = link_sweep(device, dtype, SMOKE_SWEEP_BYTES if args.smoke else SWEEP_BYTES) if world > 1 else []
    hbm = copy_bytes_per_s(device, 2**22 if args.smoke else 2**30)
    meta["link_sweep"], meta["copy_bytes_per_s"] = sweep, hbm
    log(start, "all-to-all sweep: " + ", ".join(f"{b / 2**20:g} MiB {t * 1e3:.3f} ms ({b / t / 1e9:.0f} GB/s)"
                                                 for b, t in sweep) + f"; device copy {hbm / 1e9:.0f} GB/s")
    element_bytes = torch.finfo(dtype).bits // 8
    rows: list[dict] = []
    for tokens in token_counts:
        rows += measure_tokens(tokens, args, shape, dtype, device, start)
        annotate(rows, shape, element_bytes, world, sweep, hbm, REFERENCE)
        # The layer and the graph (its memory) went with measure_tokens' frame.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if rank == 0:
            out_dir.mkdir(parents=True, exist_ok=True)
            results = {**meta, "rows": rows, "targets": targets(rows, ep_tokens, graph_tokens, args.skewed)}
            path.with_suffix(".json").write_text(json.dumps(results, indent=1))
    ok = all(r["agrees"] and (r["rel_err_vs_torch_ep"] or 0.0) <= TOLERANCE[dtype] for r in rows)
    if rank == 0:
        plot(rows, path.with_suffix(".png"))
        print(f"results: {path.with_suffix('.json')}")
        print(f"\n({time.time() - start:.0f} s)")
        print_table(meta, rows, targets(rows, ep_tokens, graph_tokens, args.skewed))
        if args.smoke:
            worst = max(max(r["rel_err_vs_one_gpu"], r["rel_err_vs_torch_ep"] or 0.0) for r in rows)
            print(f"smoke: every EP output and gradient against the one-GPU layer and plain torch EP, largest "
                  f"relative error {worst:.1e} (tolerance {TOLERANCE[dtype]:.0e}): {'ok' if ok else 'FAILED'}",
                  flush=True)
    return ok or not args.smoke


def init_rank(rank: int, local_rank: int, world: int, init_method: str, smoke: bool) -> torch.device:
    if smoke:
        # The ranks share the machine's cores.
        torch.set_num_threads(1)
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group("gloo" if smoke else "nccl", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S[device.type]))
    return device


def rank_main(rank: int, local_rank: int, world: int, init_method: str, args) -> bool:
    device = init_rank(rank, local_rank, world, init_method, args.smoke)
    try:
        return run(args, device)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, args) -> None:
    if not rank_main(rank, rank, world, f"tcp://127.0.0.1:{port}", args):
        raise SystemExit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    impl_names = ["one-GPU expert_layer", EXACT, OVERLAP, CAPACITY, "fuseops EP chunks", GRAPHED]
    parser.add_argument("--world-size", type=int, help="ranks to spawn (default: every visible GPU); under torchrun, "
                                                        "its WORLD_SIZE")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="tokens per GPU")
    parser.add_argument("--skewed", action="store_true", help="half the tokens send their top-1 to expert 0")
    parser.add_argument("--capacity-factor", type=float, default=CAPACITY_FACTOR,
                        help="the capacity rows' expert_capacity factor")
    parser.add_argument("--chunks", type=int, nargs="*", default=list(CHUNKS), help="the capacity chunks rows' chunks")
    parser.add_argument("--pieces", type=int, nargs="*", default=list(PIECES),
                        help="the overlapped exact rows' remote pieces (dispatch_chunks without capacity)")
    parser.add_argument("--impls", nargs="*", default=impl_names, choices=impl_names,
                        help="rows to run (the one-GPU layer and plain torch EP always run)")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--smoke", action="store_true", help="2 gloo ranks on the CPU, a tiny float32 layer")
    parser.add_argument("--out-dir", type=Path, help="default benchmarks/results (with --smoke the temp dir)")
    args = parser.parse_args()
    if "fuseops EP chunks" not in args.impls:
        args.chunks = []
    if OVERLAP not in args.impls:
        args.pieces = []
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        ok = rank_main(rank, int(os.environ.get("LOCAL_RANK", rank)), world, "env://", args)
        raise SystemExit(0 if ok else 1)
    world = 2 if args.smoke else args.world_size or torch.cuda.device_count()
    if not args.smoke and not 1 <= world <= torch.cuda.device_count():
        raise SystemExit(f"--world-size: expected 1 to {torch.cuda.device_count()} (the visible GPUs), got {world}")
    try:
        mp.spawn(_spawned, args=(world, _free_port(), args), nprocs=world)
    except ProcessException as exc:
        print(f"a rank failed: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
