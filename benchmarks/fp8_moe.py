"""The MoE expert layer under each quantized recipe against our bf16 layer, timed as an
optimizer step of 1 and of 8 micro-batches.

The layer is ``benchmarks.moe_layer``'s fuseops layer (``fuseops.moe.expert_layer``: under a
recipe its quantized Function, fuseops/moe/expert_layer_quantized.py, which quantizes the
permuted tokens and their gradients straight from the tokens) at the Qwen3-30B-A3B and
Mixtral-8x7B shapes, T tokens per micro-batch. The ``... composed`` rows run the composition
(permute -> GroupedLinear, scaled SwiGLU, GroupedLinear -> unpermute) under the same recipe, in
the same run. One optimizer step = ``n`` micro-batches of forward+backward (gradients of the expert
weights accumulate; the input's and router weights' are dropped after each), then
one in-place update of both expert weights (``w -= 1e-6 * grad``: what an optimizer's step
does to the version counters, so the quantized-weight cache re-quantizes once per step), then
the gradients are set to None. Each row reports ms per micro-batch (the step's time / n),
TFLOP/s (``18*T*K*H*I`` per micro-batch) and the speed-up over bf16 at the same cadence.
``--main-grad``: the weight gradients go into float32 ``main_grad`` buffers (the wgrad kernels
add to them: no accumulation kernel; the step reads and zeroes them), as Megatron-style training
keeps them. ``fp8 ... nocache`` rows run the recipe with ``cache_weights=False`` (every micro-batch
re-quantizes both weights): the cache's own effect. ``--ab-fusions`` adds rows with FC1's
activation-quantize epilogue forced on in the layer (``grouped_scaled_act.UNFUSED_FASTER`` emptied:
FP8 declines it) and with BackwardQuantizedGatedMLP forced on in the composition (its guard
declines every format): the measurements that decide those two choices.

    python -m benchmarks.fp8_moe                       # GPU: table, results/fp8_moe-<gpu>-<date>.json
    python -m benchmarks.fp8_moe --smoke               # CPU, tiny shapes, end to end

Timing as in ``benchmarks.moe_layer``: ``do_bench`` medians (L2 flushed before each step) in
interleaved rounds, or ``--timing sustained``. ``--smoke`` runs on the CPU through the torch
references at E=4, T=64, H=64, I=32, K=2, times with ``time.perf_counter`` and checks that
the cached and uncached layers give bit-identical outputs and gradients over two steps, and
the layer and the composition too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import fuseops
from benchmarks._moe_impls import Case, composed_layer, fuseops_layer, make_case, quantized
from benchmarks._results import results_path
from benchmarks.moe_layer import SHAPES
from fuseops.fusions import backward_quantized_gated_mlp
from fuseops.kernels.gemm import grouped_scaled_act

SMOKE_SHAPES = {"smoke": dict(E=4, T=64, H=64, I=32, K=2)}
RECIPES = {
    "fp8 current": fuseops.recipes.FP8CurrentScaling(),
    "fp8 blockwise": fuseops.recipes.FP8Blockwise(),
    "mxfp8": fuseops.recipes.MXFP8(),
    "nvfp4": fuseops.recipes.NVFP4(),
}
CADENCES = (1, 8)
LR = 1e-6


@contextlib.contextmanager
def _setting(module, name: str, value) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def variant(layer: Callable[[], torch.Tensor], module, name: str, value) -> Callable[[], torch.Tensor]:
    """``layer`` with a fusion's module-level choice set to ``value`` during its calls (its
    plan is made, and cached, in its first call): an A/B of a fusion's guard in one run."""

    def run() -> torch.Tensor:
        with _setting(module, name, value):
            return layer()

    return run


def layers(case: Case, recipe_names: list[str], args) -> dict[str, Callable[[], torch.Tensor]]:
    impls = {"bf16": fuseops_layer(case)}
    for name in recipe_names:
        recipe = RECIPES[name]
        impls[name] = quantized(fuseops_layer(case), recipe)
        impls[f"{name} composed"] = quantized(composed_layer(case), recipe)
        if args.nocache:
            impls[f"{name} nocache"] = quantized(fuseops_layer(case), dataclasses.replace(recipe, cache_weights=False))
        if args.ab_fusions:
            # Both fusions decline these formats by measurement: each forced on here.
            # The layer reads the forward's choice at each call; the backward fusion serves the composition.
            impls[f"{name} fused fwd"] = variant(quantized(fuseops_layer(case), recipe), grouped_scaled_act,
                                                 "UNFUSED_FASTER", ())
            impls[f"{name} fused bwd"] = variant(quantized(composed_layer(case), recipe), backward_quantized_gated_mlp,
                                                 "DECLINED", ())
    return impls


def optimizer_step(case: Case, layer: Callable[[], torch.Tensor], micro_batches: int) -> Callable[[], None]:
    """``micro_batches`` forward+backward calls, then one in-place update of the expert
    weights (an optimizer step's version bump), then their gradients dropped.

    The update's direction alternates from step to step. The benchmark's gradient points the
    same way at every step (the same tokens, routing and ``dy``), so plain descent grew the
    weights without bound: at Mixtral's shape they were infinite after ~20 steps and NaN after,
    and every row timed after that would have run on NaN weights."""
    alpha = [-LR]

    def step() -> None:
        for _ in range(micro_batches):
            layer().backward(case.dy)
            case.x.grad = case.weights.grad = None
        if case.main_grad:
            # Megatron-style: the float32 buffers are the step's gradients, zeroed in place after.
            grads = [case.w1.main_grad, case.w2.main_grad]
            with torch.no_grad():
                torch._foreach_add_([case.w1, case.w2], grads, alpha=alpha[0])
                torch._foreach_zero_(grads)
        else:
            with torch.no_grad():
                torch._foreach_add_([case.w1, case.w2], [case.w1.grad, case.w2.grad], alpha=alpha[0])
            case.w1.grad = case.w2.grad = None
        alpha[0] = -alpha[0]

    return step


def tflops_per_micro_batch(shape: dict, ms: float) -> float:
    return 18.0 * shape["T"] * shape["K"] * shape["H"] * shape["I"] / (ms * 1e-3) / 1e12


def time_ms(fn: Callable[[], None], args) -> float:
    if args.smoke:
        fn()  # warm-up
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    if args.timing == "do_bench":
        import triton

        return triton.testing.do_bench(fn, warmup=max(25, args.rep // 4), rep=args.rep, return_mode="median")
    from benchmarks._timing import sustained_ms

    return sustained_ms(fn, warmup_s=args.warmup_s, steps=args.steps)


def bitwise_check(case: Case, recipe_names: list[str]) -> dict[str, bool]:
    """Two optimizer steps of 2 micro-batches, cached against uncached and against the
    composition: outputs and gradients identical bit for bit (each run starts from the same
    weights)."""
    w1, w2 = case.w1.detach().clone(), case.w2.detach().clone()
    result = {}
    for name in recipe_names:
        runs = []
        uncached = dataclasses.replace(RECIPES[name], cache_weights=False)
        variants = [(fuseops_layer, RECIPES[name]), (fuseops_layer, uncached), (composed_layer, RECIPES[name])]
        for make, recipe in variants:
            with torch.no_grad():
                case.w1.copy_(w1)
                case.w2.copy_(w2)
            layer, got = quantized(make(case), recipe), []
            for _ in range(2):
                for _ in range(2):
                    y = layer()
                    y.backward(case.dy)
                    got += [y.detach(), case.x.grad, case.weights.grad]
                    case.x.grad = case.weights.grad = None
                grads = (case.w1.main_grad, case.w2.main_grad) if case.main_grad else (case.w1.grad, case.w2.grad)
                got += [g.clone() for g in grads]
                optimizer_step(case, lambda: None, 0)()
            runs.append(got)
        result[name] = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                           for run in runs[1:] for a, b in zip(runs[0], run, strict=True))
    with torch.no_grad():
        case.w1.copy_(w1)
        case.w2.copy_(w2)
    return result


def _allocator_retries(device: str) -> int:
    return torch.cuda.memory_stats().get("num_alloc_retries", 0) if device == "cuda" else 0


def run(args) -> tuple[list[dict], dict]:
    shapes = SMOKE_SHAPES if args.smoke else {name: SHAPES[name] for name in args.shapes}
    if args.tokens:
        # The small and medium sizes a user starts at: each shape at each token count.
        shapes = {f"{name} T={t}": dict(shape, T=t) for name, shape in shapes.items() for t in args.tokens}
    device = "cpu" if args.smoke else "cuda"
    rows, extra = [], {}
    for shape_name, shape in shapes.items():
        print(f"\n{shape_name} {shape}", flush=True)
        case = make_case(**shape, device=device, main_grad=args.main_grad)
        if args.smoke:
            extra["bitwise_cached_vs_uncached"] = same = bitwise_check(case, args.recipes)
            print(f"  cached, uncached and the composition, bit for bit: {same}", flush=True)
        impls = layers(case, args.recipes, args)
        for n in args.cadences:
            fns = {name: optimizer_step(case, layer, n) for name, layer in impls.items()}
            times: dict[str, list[float]] = {name: [] for name in fns}
            cached: dict[str, int] = {}
            # The caching allocator's retries (a cudaFree of every cached block, then the malloc
            # again: a host sync) and its peak reservation while each implementation ran.
            retries: dict[str, int] = dict.fromkeys(fns, 0)
            reserved: dict[str, int] = dict.fromkeys(fns, 0)
            for _ in range(args.rounds):
                for name, fn in fns.items():
                    fuseops.weight_cache.clear()
                    before = _allocator_retries(device)
                    if device == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    times[name].append(time_ms(fn, args) / n)
                    cached[name] = fuseops.weight_cache.cached_bytes()
                    retries[name] += _allocator_retries(device) - before
                    if device == "cuda":
                        reserved[name] = max(reserved[name], torch.cuda.max_memory_reserved())
            base = sorted(times["bf16"])[len(times["bf16"]) // 2]
            for name, ts in times.items():
                ms = sorted(ts)[len(ts) // 2]
                row = dict(shape=shape_name, **shape, micro_batches=n, impl=name, ms_per_micro_batch=ms,
                           tflops=tflops_per_micro_batch(shape, ms), vs_bf16=base / ms,
                           weight_cache_bytes=cached[name], allocator_retries=retries[name],
                           peak_reserved_bytes=reserved[name])
                rows.append(row)
                print(f"  {n} micro-batch{'es' if n > 1 else ''} {name:<22} {ms:9.3f} ms {row['tflops']:8.1f} TFLOP/s "
                      f"{row['vs_bf16']:5.2f}x bf16, cache {cached[name] / 1e6:.3f} MB, "
                      f"allocator retries {retries[name]}, reserved {reserved[name] / 1e9:.1f} GB", flush=True)
        del case, impls, fns
        fuseops.weight_cache.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, one round: checks it runs")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tokens", nargs="*", type=int, help="token counts per micro-batch (default: the shape's)")
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--cadences", nargs="*", type=int, default=list(CADENCES),
                        help="micro-batches per optimizer step")
    parser.add_argument("--nocache", action="store_true", help="also time each recipe with cache_weights=False")
    parser.add_argument("--ab-fusions", action="store_true",
                        help="also time each recipe with FC1's act-quantize epilogue forced on and with "
                             "BackwardQuantizedGatedMLP off")
    parser.add_argument("--main-grad", action="store_true",
                        help="every layer's GroupedLinears add their weight gradients to a float32 main_grad "
                             "(accumulate_into_main_grad), which the step reads and zeroes")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per implementation")
    parser.add_argument("--timing", choices=("do_bench", "sustained"), default="do_bench")
    parser.add_argument("--rep", type=int, default=200, help="do_bench: ms of timed repetitions per measurement")
    parser.add_argument("--steps", type=int, default=5, help="sustained: optimizer steps timed per measurement")
    parser.add_argument("--warmup-s", type=float, default=0.5, help="sustained: seconds of steps before each")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default results/fp8_moe-<gpu>-<date>.json; with --smoke the temp dir)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    start = time.time()
    rows, extra = run(args)
    out = args.out or (Path(tempfile.gettempdir()) / "fp8_moe-smoke.json" if args.smoke else results_path("fp8_moe"))
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(device="cpu" if args.smoke else torch.cuda.get_device_name(), torch=torch.__version__,
                timing="perf_counter" if args.smoke else args.timing, lr=LR)
    out.write_text(json.dumps(dict(**meta, **extra, rows=rows), indent=1))
    print(f"\n{out} ({time.time() - start:.0f} s)")
    if args.smoke and not all(extra["bitwise_cached_vs_uncached"].values()):
        raise SystemExit("cached and uncached layers (or the layer and the composition) differ")


if __name__ == "__main__":
    main()
