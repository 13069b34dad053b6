"""The whole MoE expert layer, bf16, forward and forward+backward, at five model shapes under
uniform and skewed routing: fuseops against plain torch (eager and ``torch.compile``), SonicMoE
(an anchor, where it imports), Liger-Kernel and transformers' experts, in one process on the very
same tensors.

The layer: tokens ``x`` [T, H], the router's top-K experts ``ids`` [T, K] and their softmax
``weights`` [T, K], SwiGLU experts ``w1`` [E, 2I, H] (gate rows, then up rows) and ``w2`` [E, H, I].
Uniform routing is the top-K of random logits (every expert equally likely); skewed routing is the
same, then every even-numbered token's top-1 slot (its largest weight) goes to expert 0, the slot
that already held expert 0 taking the old top-1 expert (a token's K experts stay distinct): half
the tokens send their top-1 to one expert, which gets about T/2 + T*K/(2E) rows.

- ``fuseops`` / ``fuseops lean``: ``fuseops.moe.expert_layer``, default mode and ``lean=True``.
- ``fuseops composed``: ``permute`` -> ``Sequential(GroupedLinear, SwiGLU(scaled=True),
  GroupedLinear)`` -> ``unpermute``: the same layer built from public ops.
- ``torch``: argsort routing, gather, ``torch._grouped_mm`` x2 (int32 offsets), SwiGLU, weighted
  ``index_add_`` combine; ``torch.compile``: the same function under ``torch.compile``.
- ``sonicmoe``: SonicMoE's ``moe_general_routing_inputs`` on its own copies of the weights in its
  layout (made once per shape, outside timing); skipped, with the reason printed, where it does not
  import (benchmarks/README.md says how to carry it to a GPU machine). Its output and gradients are
  checked against fuseops' in every cell; a row whose largest relative error is over
  ``SONICMOE_TOLERANCE`` is marked, not dropped.
- ``liger``: Liger-Kernel's fused MoE (on request: ``pip install --no-deps liger-kernel==0.8.5``).
- ``hf grouped_mm`` / ``hf fuseops``: transformers' ``Qwen3MoeExperts`` with ``grouped_mm`` / ``fuseops``.
- ``fuseops fp8`` / ``fp8 blk`` (and ``... layer``, on request): FP8 current scaling / blockwise.

FLOP: ``6*T*K*H*I`` per forward, ``18*T*K*H*I`` per forward+backward; the fraction is of the
card's bf16 dense peak (``--peak-tflops``, 790). Each step makes new leaves for ``x`` and the
router weights (as a training step's inputs are new tensors) and resets the weights' gradients.
Two timings per implementation, in interleaved rounds (median of rounds): ``do_bench``, the median
over ``--rep`` ms of steps with an L2 flush before each (``--timing sustained``: a steady-state
loop after half a second of steps), and ``loop``, 3 steps, then 20 steps between two CUDA events.
Peak memory is over one forward+backward, above the step's start (weights, inputs and ``dy``
allocated; the gradients are made inside the step and count), allocated and reserved. Last,
fuseops' forward+backward is captured in a CUDA graph at the Qwen3 shape and replayed with new
routing (``--no-graph`` skips it). ``--smoke`` runs everything but the memory, the graph and
SonicMoE on the CPU at a tiny shape (checks the script). The results file is written after
every cell: a run stopped by a time limit keeps what it measured.

    python -m benchmarks.moe_layer             # every cell; moe_layer-<gpu>-<date>.json and .png under benchmarks/results
    python -m benchmarks.moe_layer --shapes qwen3-30b-a3b olmoe-1b-7b --routing uniform skewed \\
        --impls fuseops "fuseops lean" torch torch.compile sonicmoe --no-graph
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.metadata
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks._moe_impls import IMPLS, ON_REQUEST, Case, SonicMoELayer, fuseops_layer, implementations, make_case
from benchmarks._results import PEAK_CONVENTION, RESULTS, pyplot, results_path
from benchmarks._timing import capture_cuda_graph, elapsed_ms, sustained_ms

# The cells' shapes, in the order they run; DeepSeek-V3's routed experts without its shared one.
CELL_SHAPES = {
    "qwen3-30b-a3b": dict(E=128, T=32768, H=2048, I=768, K=8),
    "olmoe-1b-7b": dict(E=64, T=16384, H=2048, I=1024, K=8),
    "mixtral-8x7b": dict(E=8, T=8192, H=4096, I=14336, K=2),
    "qwen3-30b-a3b-t4096": dict(E=128, T=4096, H=2048, I=768, K=8),
    "deepseek-v3": dict(E=256, T=8192, H=7168, I=2048, K=8),
}
# The shapes fp8_moe, fp8_gemm_tiles and moe_profile take.
SHAPES = {name: CELL_SHAPES[name] for name in ("qwen3-30b-a3b", "mixtral-8x7b")}
SMOKE_SHAPES = {"smoke": dict(E=4, T=64, H=64, I=32, K=2)}
ROUTINGS = ("uniform", "skewed")
MODES = ("fwd", "fwd+bwd")
# The card's bf16 dense peak that the fractions are of (--peak-tflops for another card).
PEAK_TFLOPS = 790.0
LOOP_WARMUP, LOOP_STEPS = 3, 20
# The largest relative error (by norm, over the output and each gradient) of SonicMoE against fuseops
# that counts as agreeing: bf16 layers summing in different orders differ by a few 1e-3.
SONICMOE_TOLERANCE = 2e-2
# Weight gradients are compared on every k-th expert, at most this many: a reference's copy of all
# of them (22.5 GB at DeepSeek-V3's shape) would not fit beside the weights and the gradients.
CHECKED_EXPERTS = 32
# A first call still running after this many seconds prints every thread's stack to stderr, then
# again each such interval: where a compile or an autotuner waits (SonicMoE's QuACK autotunes each
# GEMM in compile subprocesses; QUACK_PRINT_AUTOTUNING=1 prints its progress).
STACKS_AFTER_S = 120


def forward_backward(case: Case, layer: Callable[[], torch.Tensor]) -> Callable[[], None]:
    return lambda: layer().backward(case.dy)


def set_grads_to_none(case: Case) -> None:
    for t in case.leaves() + case.anchor_weights:
        t.grad = None


def step(case: Case, layer: Callable[[], torch.Tensor], mode: str) -> Callable[[], None]:
    """One timed step: the gradients reset, new input leaves, the forward (with autograd
    recording, as in training) and for ``fwd+bwd`` the backward."""

    def run() -> None:
        set_grads_to_none(case)
        case.fresh_leaves()
        y = layer()
        if mode == "fwd+bwd":
            y.backward(case.dy)

    return run


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def outputs(case: Case, layer: Callable[[], torch.Tensor], experts: torch.Tensor) -> dict[str, torch.Tensor]:
    """Output and gradients of one forward+backward, the weight gradients of ``experts`` only."""
    set_grads_to_none(case)
    y = layer()
    y.backward(case.dy)
    if isinstance(layer, SonicMoELayer):
        dw1, dw2 = layer.weight_grads(experts)
    else:
        dw1, dw2 = case.w1.grad[experts], case.w2.grad[experts]
    got = dict(y=y.detach(), dx=case.x.grad, dweights=case.weights.grad, dw1=dw1, dw2=dw2)
    set_grads_to_none(case)
    return got


def agreement(case: Case, impls: dict) -> tuple[dict[str, dict[str, float]], dict | None]:
    """Each implementation's output and gradients against plain torch (relative errors by norm), and
    SonicMoE's against fuseops' (None unless both run); an implementation that fails is reported
    and dropped from ``impls``. The first call of each is timed and printed: it compiles."""
    E = case.w1.shape[0]
    experts = torch.arange(0, E, max(1, E // CHECKED_EXPERTS), device=case.w1.device)
    errs, got, sonic = {}, {}, None
    # torch first (the reference), fuseops before SonicMoE (its reference).
    first = [n for n in ("torch", "fuseops", "sonicmoe") if n in impls]
    for name in first + [n for n in impls if n not in first]:
        start = time.perf_counter()
        # The line ends when the call does: a long compile shows which implementation it is in.
        print(f"  {name:<16} first fwd+bwd", end="", flush=True)
        faulthandler.dump_traceback_later(STACKS_AFTER_S, repeat=True)
        try:
            out = outputs(case, impls[name], experts)
        except Exception as exc:  # report a failing baseline, keep the others
            print(f": {exc!r}"[:300], flush=True)
            set_grads_to_none(case)
            del impls[name]
            continue
        finally:
            faulthandler.cancel_dump_traceback_later()
        if name in ("torch", "fuseops"):
            got[name] = out
        errs[name] = {k: _rel_err(v, got["torch"][k]) for k, v in out.items()}
        print(f" {time.perf_counter() - start:6.1f} s; rel err vs torch: "
              + " ".join(f"{k} {v:.1e}" for k, v in errs[name].items()), flush=True)
        if name == "sonicmoe" and "fuseops" in got:
            vs = {k: _rel_err(v, got["fuseops"][k]) for k, v in out.items()}
            worst = max(vs.values())
            sonic = dict(rel_err_vs_fuseops=vs, max_rel_err_vs_fuseops=worst, agrees=worst <= SONICMOE_TOLERANCE)
            verdict = "agree" if sonic["agrees"] else f"DISAGREE (over {SONICMOE_TOLERANCE:.0e}; its rows are marked)"
            print(f"  sonicmoe vs fuseops: max rel err {worst:.2e}: {verdict}", flush=True)
    return errs, sonic


def bench_ms(fn: Callable[[], object], args) -> float:
    if args.smoke:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    if args.timing == "do_bench":
        import triton

        return triton.testing.do_bench(fn, warmup=max(25, args.rep // 4), rep=args.rep, return_mode="median")
    return sustained_ms(fn, warmup_s=args.warmup_s, steps=args.steps)


def loop_ms(fn: Callable[[], object], device: str, steps: int = LOOP_STEPS, warmup: int = LOOP_WARMUP) -> float:
    """``warmup`` steps, then ``steps`` steps between two CUDA events (wall time off the GPU): a
    training loop's first steps, nothing left to settle."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return elapsed_ms(lambda: [fn() for _ in range(steps)], device) / steps


def peak_memory_gb(case: Case, fn: Callable[[], object]) -> dict[str, float]:
    """Over one call of ``fn`` (GB): the peak allocated, and the peaks above the call's start,
    allocated and reserved."""
    set_grads_to_none(case)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    set_grads_to_none(case)
    return dict(peak_gb=peak / 1e9, peak_above_start_gb=(peak - allocated) / 1e9,
                reserved_above_start_gb=(torch.cuda.max_memory_reserved() - reserved) / 1e9)


def tflops(shape: dict, mode: str, ms: float) -> float:
    flops = 6.0 * shape["T"] * shape["K"] * shape["H"] * shape["I"] * (3 if mode == "fwd+bwd" else 1)
    return flops / (ms * 1e-3) / 1e12


def measure_cell(case: Case, shape_name: str, shape: dict, routing: str, impls: dict, args) -> list[dict]:
    """One shape under one routing: agreement, peak memory, then both timings of every
    implementation in interleaved rounds; one row per mode and implementation."""
    errs, sonic = agreement(case, impls)
    nan = dict.fromkeys(("peak_gb", "peak_above_start_gb", "reserved_above_start_gb"), float("nan"))
    memory = {}
    for name, layer in impls.items():
        try:
            memory[name] = nan if args.smoke else peak_memory_gb(case, step(case, layer, "fwd+bwd"))
        except Exception as exc:  # out of memory, say: report it, time the layer all the same
            print(f"  {name} peak memory: {exc!r}"[:300], flush=True)
            memory[name] = nan
    for name, m in memory.items():
        print(f"  {name:<16} fwd+bwd peak above the step's start: {m['peak_above_start_gb']:6.2f} GB allocated, "
              f"{m['reserved_above_start_gb']:6.2f} GB reserved", flush=True)
    device = case.x.device.type
    loop_steps = (2, 1) if args.smoke else (LOOP_STEPS, LOOP_WARMUP)
    rows = []
    for mode in MODES:
        fns = {n: step(case, layer, mode) for n, layer in impls.items()}
        times: dict[str, list[float]] = {n: [] for n in fns}
        loops: dict[str, list[float]] = {n: [] for n in fns}
        for r in range(args.rounds):
            for name, fn in fns.items():
                try:
                    times[name].append(bench_ms(fn, args))
                    loops[name].append(loop_ms(fn, device, *loop_steps))
                except Exception as exc:  # report a failing baseline, keep the others
                    print(f"  {mode} {name}: {exc!r}"[:300], flush=True)
            print(f"  {mode} round {r + 1}/{args.rounds} TFLOP/s (do_bench/loop): " + ", ".join(
                f"{n} {tflops(shape, mode, times[n][-1]):.0f}/{tflops(shape, mode, loops[n][-1]):.0f}"
                for n in fns if loops[n]), flush=True)
        set_grads_to_none(case)
        for name, ts in times.items():
            if not loops[name]:
                continue
            ms, loop = sorted(ts)[len(ts) // 2], sorted(loops[name])[len(loops[name]) // 2]
            row = dict(shape=shape_name, routing=routing, **shape, mode=mode, impl=name, ms=ms,
                       tflops=tflops(shape, mode, ms), peak_fraction=tflops(shape, mode, ms) / args.peak_tflops,
                       loop_ms=loop, loop_tflops=tflops(shape, mode, loop),
                       loop_peak_fraction=tflops(shape, mode, loop) / args.peak_tflops,
                       **memory[name], rel_err_vs_torch=errs[name])
            if name == "sonicmoe" and sonic is not None:
                row.update(sonic)
            rows.append(row)
    return rows


def eager_outputs(case: Case, layer: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
    """Output and gradients of one eager forward+backward. Nothing of its graph outlives the
    call: a live AccumulateGrad node made on the default stream breaks a later capture."""
    set_grads_to_none(case)
    y = layer()
    y.backward(case.dy)
    return [y.detach()] + [t.grad.clone() for t in case.leaves()]


def graph_check(case: Case, lean: bool) -> dict:
    """Capture fuseops' forward+backward in a CUDA graph under one routing, replay it after
    copying another routing into the same tensors, and compare the output and gradients
    with an eager run of that routing (relative errors)."""
    layer = fuseops_layer(case, lean)
    case.route(1)
    ref = eager_outputs(case, layer)
    case.route(2)

    def step() -> torch.Tensor:
        set_grads_to_none(case)
        y = layer()
        y.backward(case.dy)
        return y

    graph, y_static = capture_cuda_graph(step)
    case.route(1)
    graph.replay()
    torch.cuda.synchronize()
    got = [y_static] + [t.grad for t in case.leaves()]
    errs = {n: _rel_err(g, r) for n, g, r in zip(("y", "dx", "dweights", "dw1", "dw2"), got, ref)}
    del graph
    set_grads_to_none(case)
    return errs


def run_benchmark(args, save: Callable[[list[dict], dict], None] | None = None) -> tuple[list[dict], dict]:
    rows, extra = [], {}
    shapes = SMOKE_SHAPES if args.smoke else {name: CELL_SHAPES[name] for name in args.shapes}
    for shape_name, shape in shapes.items():
        print(f"\n{shape_name} {shape}", flush=True)
        # torch.compile traces each shape afresh (no recompile limit, no dynamic shapes).
        torch._dynamo.reset()
        case = make_case(**shape, device="cpu" if args.smoke else "cuda")
        # On the CPU, aot_eager: the same trace and autograd, without compiling C++ for a tiny shape.
        impls = implementations(case, args.impls, compile_backend="aot_eager" if args.smoke else "inductor")
        for routing in args.routing:
            print(f"\n{shape_name} {routing} routing", flush=True)
            case.route(0, skewed=routing == "skewed")
            rows += measure_cell(case, shape_name, shape, routing, impls, args)
            if save is not None:
                save(rows, extra)
        # The timing closures hold the case, and the last timed call left its gradients: both
        # would count in the next shape's peak memory (2.82 GB at Mixtral after Qwen3: Qwen3's
        # tensors and gradients).
        set_grads_to_none(case)
        del case, impls
        if not args.smoke:
            torch.cuda.empty_cache()
    if not args.no_graph and not args.smoke:
        # Last, so that a failed capture cannot disturb the timings.
        shape_name = "qwen3-30b-a3b"
        for mode, lean in (("default", False), ("lean", True)):
            key = f"cuda_graph_{mode}"
            try:
                errs = graph_check(make_case(**SHAPES[shape_name]), lean)
                extra[key] = dict(shape=shape_name, captured=True, rel_err_vs_eager=errs)
            except Exception as exc:
                extra[key] = dict(shape=shape_name, captured=False, error=repr(exc)[:500])
            print(f"\ncuda graph fwd+bwd ({mode}): {extra[key]}", flush=True)
            torch.cuda.empty_cache()
    return rows, extra


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else float("nan")


def print_table(rows: list[dict], extra: dict) -> None:
    by = {(r["shape"], r["routing"], r["mode"], r["impl"]): r for r in rows}
    print("\nMoE expert layer, bf16: TFLOP/s (6*T*K*H*I per fwd, 18*T*K*H*I per fwd+bwd), do_bench and a 20-step")
    print("loop; % of the bf16 dense peak (do_bench); fwd+bwd peak memory above the step's start (GB); speed")
    print("(do_bench) and allocated peak against plain torch and SonicMoE in the same run")
    head = (f"{'cell':<28}{'impl':<18}{'fwd':>6}{'fwd+bwd':>9}{'% peak':>8}{'loop':>7}{'alloc':>8}{'reserved':>10}"
            f"{'x torch':>9}{'x sonic':>9}{'mem x sonic':>13}")
    print(head)
    print("-" * len(head))
    for shape, routing in dict.fromkeys((r["shape"], r["routing"]) for r in rows):
        torch_row = by.get((shape, routing, "fwd+bwd", "torch"), {})
        sonic_row = by.get((shape, routing, "fwd+bwd", "sonicmoe"), {})
        for impl in IMPLS:
            fb = by.get((shape, routing, "fwd+bwd", impl))
            if fb is None:
                continue
            fwd = by.get((shape, routing, "fwd", impl), {}).get("tflops", float("nan"))
            mark = "" if fb.get("agrees", True) else f"  DISAGREES with fuseops: max rel err {fb['max_rel_err_vs_fuseops']:.1e}"
            print(f"{shape + ' ' + routing:<28}{impl:<18}{fwd:>6.0f}{fb['tflops']:>9.0f}{100 * fb['peak_fraction']:>7.0f}%"
                  f"{fb['loop_tflops']:>7.0f}{fb['peak_above_start_gb']:>8.2f}{fb['reserved_above_start_gb']:>10.2f}"
                  f"{_ratio(fb['tflops'], torch_row.get('tflops')):>9.2f}{_ratio(fb['tflops'], sonic_row.get('tflops')):>9.2f}"
                  f"{_ratio(fb['peak_above_start_gb'], sonic_row.get('peak_above_start_gb')):>13.2f}{mark}")
    for key in ("cuda_graph_default", "cuda_graph_lean"):
        if key in extra:
            print(f"CUDA graph ({key.removeprefix('cuda_graph_')}, fwd+bwd replayed with new routing): {extra[key]}")


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    panels = [("tflops", "fwd+bwd TFLOP/s, do_bench"), ("loop_tflops", "fwd+bwd TFLOP/s, 20-step loop"),
              ("peak_above_start_gb", "fwd+bwd peak above the step's start, allocated, GB"),
              ("reserved_above_start_gb", "fwd+bwd peak above the step's start, reserved, GB")]
    fb = [r for r in rows if r["mode"] == "fwd+bwd"]
    cells = list(dict.fromkeys((r["shape"], r["routing"]) for r in fb))
    impls = [i for i in IMPLS if any(r["impl"] == i for r in fb)]
    by = {(r["shape"], r["routing"], r["impl"]): r for r in fb}
    fig, axes = plt.subplots(2, 2, figsize=(max(12, 2.2 * len(cells)), 9))
    width = 0.8 / max(1, len(impls))
    for ax, (field_, title) in zip(axes.flat, panels):
        for i, impl in enumerate(impls):
            got = [by.get((*c, impl), {}) for c in cells]
            bars = ax.bar([j + width * (i - (len(impls) - 1) / 2) for j in range(len(cells))],
                          [r.get(field_, 0) for r in got], width, label=impl)
            for bar, r in zip(bars, got):
                # SonicMoE's rows where it disagrees with fuseops: hatched.
                if not r.get("agrees", True):
                    bar.set_hatch("//")
        ax.set_xticks(range(len(cells)), [f"{s}\n{r}" for s, r in cells], fontsize=7)
        ax.set_title(f"{title} (bf16)")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=list(CELL_SHAPES), choices=list(CELL_SHAPES))
    parser.add_argument("--routing", nargs="*", default=list(ROUTINGS), choices=ROUTINGS)
    # Liger only when named: on an H100 its first call (Liger-Kernel 0.8.5) did not finish in
    # 190-240 s at either shape.
    parser.add_argument("--impls", nargs="*", default=[i for i in IMPLS if i not in ON_REQUEST], choices=list(IMPLS),
                        help="implementations to time (torch, the reference, always runs)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per implementation")
    parser.add_argument("--timing", choices=("do_bench", "sustained"), default="do_bench",
                        help="do_bench (the results files' method) or _timing.sustained_ms (a training loop's steady state)")
    parser.add_argument("--rep", type=int, default=200, help="do_bench: ms of timed repetitions per measurement")
    parser.add_argument("--steps", type=int, default=20, help="sustained: back-to-back calls timed per measurement")
    parser.add_argument("--warmup-s", type=float, default=0.5, help="sustained: seconds of calls before each measurement")
    parser.add_argument("--peak-tflops", type=float, default=PEAK_TFLOPS, help="the card's bf16 dense peak")
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph capture check")
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny shape, one round, no memory: checks it runs")
    parser.add_argument("--out-dir", type=Path, help="default benchmarks/results (with --smoke the temp dir)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    import triton

    start = time.time()
    out_dir = args.out_dir or (Path(tempfile.gettempdir()) if args.smoke else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(device="cpu" if args.smoke else torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, timing="smoke" if args.smoke else args.timing, peak_tflops=args.peak_tflops,
                sonicmoe_tolerance=SONICMOE_TOLERANCE, peak=PEAK_CONVENTION)
    for package in ("transformers", "sonic-moe", "quack-kernels"):
        try:
            meta[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    path = results_path("moe_layer", "", device="cpu" if args.smoke else "cuda", directory=out_dir)

    def save(rows: list[dict], extra: dict) -> None:
        path.with_suffix(".json").write_text(json.dumps(dict(**meta, **extra, rows=rows), indent=1))

    rows, extra = run_benchmark(args, save)
    save(rows, extra)
    plot(rows, path.with_suffix(".png"))
    print(f"results: {path.with_suffix('.json')}")
    print(f"\n({time.time() - start:.0f} s)")
    print_table(rows, extra)


if __name__ == "__main__":
    main()
