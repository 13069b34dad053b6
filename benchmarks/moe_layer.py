"""The whole MoE expert layer, bf16, forward and forward+backward: fuseops against the same
layer in plain torch with ``torch._grouped_mm``, Liger-Kernel's fused MoE (where it imports)
and transformers' experts, at the Qwen3-30B-A3B and Mixtral-8x7B shapes.

The layer: tokens ``x`` [T, H], the router's top-K experts ``ids`` [T, K] (random logits,
so about uniform) and their softmax ``weights`` [T, K], SwiGLU experts ``w1`` [E, 2I, H] and
``w2`` [E, H, I]; every implementation uses the very same tensors.

- ``fuseops``: ``fuseops.moe.expert_layer`` (routing, the fused grouped MLP and the combine in
  one Function), default mode; ``fuseops lean``: the same with ``lean=True``.
- ``fuseops composed``: ``permute`` -> ``Sequential(GroupedLinear, SwiGLU(scaled=True),
  GroupedLinear)`` (one fused grouped MLP) -> ``unpermute``: the same layer built from public ops.
- ``torch``: argsort routing, gather, ``torch._grouped_mm`` x2 (int32 offsets), SwiGLU,
  weighted ``index_add_`` combine.
- ``liger``: ``liger_kernel.ops.fused_moe.LigerFusedMoEFunction`` (on request; skipped when it does
  not import: ``pip install --no-deps liger-kernel==0.8.5``).
- ``hf grouped_mm``: transformers' ``Qwen3MoeExperts`` with ``experts_implementation="grouped_mm"``.
- ``hf fuseops``: the same module with ``"fuseops"`` (fuseops.integrations.transformers).
- ``fuseops fp8`` / ``fp8 blk``: the composition under FP8 current scaling / blockwise.

TFLOP/s count ``6*T*K*H*I`` per forward (two GEMMs, FC1 twice as wide) and three times that
per forward+backward; the forward is timed with autograd recording, as in a training step.
Each measurement is ``triton.testing.do_bench``'s median over ``--rep`` ms of calls (an L2
flush before each), or with ``--timing sustained`` a training loop's steady state:
back-to-back calls timed together after half a second of the same calls
(``_timing.sustained_ms``; the layer holds the H100 at its power cap, where clocks depend on
the work). Implementations are timed in interleaved rounds (median of rounds). Peak memory is
``max_memory_allocated`` over one forward+backward, reported whole and above what was
allocated at the step's start (inputs, weights, the upstream gradient; the weight gradients
are made inside the step and count). Last, fuseops' forward+backward (both modes) is captured
in a CUDA graph at the Qwen3 shape, replayed with new routing copied into the same tensors,
and checked against an eager run. ``--smoke`` runs everything but the memory and the graph on
the CPU at a tiny shape (checks the script).

    python -m benchmarks.moe_layer             # table; moe_layer-<gpu>-<date>.json and .png under benchmarks/results
    python -m benchmarks.moe_layer --impls fuseops "fuseops lean" "fuseops composed" liger --no-graph
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import fuseops
from benchmarks._results import RESULTS, results_path
from benchmarks._timing import capture_cuda_graph, sustained_ms
from fuseops import ops
from fuseops.moe import expert_layer, permute, unpermute

SHAPES = {
    "qwen3-30b-a3b": dict(E=128, T=32768, H=2048, I=768, K=8),
    "mixtral-8x7b": dict(E=8, T=8192, H=4096, I=14336, K=2),
}
SMOKE_SHAPES = {"smoke": dict(E=4, T=64, H=64, I=32, K=2)}
IMPLS = ("fuseops", "fuseops lean", "fuseops composed", "torch", "liger", "hf grouped_mm", "hf fuseops",
         "fuseops fp8", "fuseops fp8 blk", "fuseops fp8 layer", "fuseops fp8 blk layer")
# Not run unless asked (--impls): the FP8 expert layers (fuseops/moe/expert_layer_quantized.py), for
# moe_profile's kernel breakdown against the FP8 compositions ("fuseops fp8", "fuseops fp8 blk").
ON_REQUEST = ("liger", "fuseops fp8 layer", "fuseops fp8 blk layer")
MODES = ("fwd", "fwd+bwd")


@dataclass
class Case:
    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    dy: torch.Tensor
    w1: torch.nn.Parameter
    w2: torch.nn.Parameter
    # The experts' GroupedLinears add their weight gradients to the weights' float32 main_grad
    # (accumulate_into_main_grad, as Megatron-style training does) instead of ``.grad``.
    main_grad: bool = False

    def leaves(self) -> list[torch.Tensor]:
        return [self.x, self.weights, self.w1, self.w2]

    def route(self, seed: int) -> None:
        """New routing (top-K of random logits, softmax weights) into the same tensors."""
        T, E = self.x.shape[0], self.w1.shape[0]
        g = torch.Generator(device=self.x.device).manual_seed(seed)
        logits = torch.randn(T, E, device=self.x.device, generator=g)
        top, ids = logits.topk(self.ids.shape[1], dim=-1)
        with torch.no_grad():
            self.ids.copy_(ids)
            self.weights.copy_(top.softmax(-1))


def make_case(E: int, T: int, H: int, I: int, K: int, device="cuda", dtype=torch.bfloat16,
              main_grad: bool = False) -> Case:
    torch.manual_seed(0)
    kw = dict(device=device, dtype=dtype)
    case = Case(
        x=torch.randn(T, H, **kw).requires_grad_(),
        ids=torch.empty(T, K, device=device, dtype=torch.int64),
        weights=torch.empty(T, K, **kw).requires_grad_(),
        dy=torch.randn(T, H, **kw),
        w1=torch.nn.Parameter(torch.randn(E, 2 * I, H, **kw) / math.sqrt(H)),
        w2=torch.nn.Parameter(torch.randn(E, H, I, **kw) / math.sqrt(I)),
        main_grad=main_grad,
    )
    if main_grad:
        for w in (case.w1, case.w2):
            w.main_grad = torch.zeros(w.shape, device=device, dtype=torch.float32)
    case.route(0)
    return case


def _experts(case: Case, scaled: bool) -> fuseops.Sequential:
    E, two_i, H = case.w1.shape
    fc1 = ops.GroupedLinear(E, H, two_i, device="meta", accumulate_into_main_grad=case.main_grad)
    fc2 = ops.GroupedLinear(E, two_i // 2, H, device="meta", accumulate_into_main_grad=case.main_grad)
    fc1.weight, fc2.weight = case.w1, case.w2
    return fuseops.Sequential(fc1, ops.SwiGLU(scaled=scaled), fc2)


def fuseops_layer(case: Case, lean: bool = False) -> Callable[[], torch.Tensor]:
    experts = _experts(case, scaled=False)
    return lambda: expert_layer(case.x, case.ids, case.weights, experts, lean=lean)


def liger_layer(case: Case) -> Callable[[], torch.Tensor]:
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

    def layer() -> torch.Tensor:
        # Liger takes int32 ids; the cast is part of its call, as a user's would be.
        return LigerFusedMoEFunction.apply(case.x, case.w1, case.w2, case.ids.to(torch.int32), case.weights)

    return layer


def composed_layer(case: Case) -> Callable[[], torch.Tensor]:
    E = case.w1.shape[0]
    mlp = _experts(case, scaled=True)

    def layer() -> torch.Tensor:
        x_sorted, split_sizes, row_map = permute(case.x, case.ids, E)
        # The router weights in x_sorted's row order: the SwiGLU's per-row scale.
        w = case.weights
        probs = w.new_empty(row_map.numel()).scatter(0, row_map.reshape(-1), w.reshape(-1))
        return unpermute(mlp(x_sorted, split_sizes, probs, split_sizes), row_map, None)

    return layer


def torch_layer(case: Case) -> Callable[[], torch.Tensor]:
    E = case.w1.shape[0]

    def layer() -> torch.Tensor:
        x, ids = case.x, case.ids
        K = ids.shape[1]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        # bincount would read the max id back to the host; scatter_add_ stays on the device.
        counts = torch.zeros(E, device=x.device, dtype=torch.int64).scatter_add_(0, flat, torch.ones_like(flat))
        offs = counts.cumsum(0).to(torch.int32)
        token = order // K
        h = torch._grouped_mm(x[token], case.w1.transpose(1, 2), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        y = torch._grouped_mm(F.silu(gate) * up, case.w2.transpose(1, 2), offs=offs)
        y = y * case.weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, token, y)

    return layer


def hf_layer(case: Case, implementation: str) -> Callable[[], torch.Tensor]:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    E, two_i, H = case.w1.shape
    config = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=two_i // 2, num_experts=E,
                            num_experts_per_tok=case.ids.shape[1], hidden_act="silu")
    config._experts_implementation = implementation
    with torch.device("meta"):
        experts = Qwen3MoeExperts(config)
    experts.gate_up_proj, experts.down_proj = case.w1, case.w2
    return lambda: experts(case.x, case.ids, case.weights)


def quantized(layer: Callable[[], torch.Tensor], recipe) -> Callable[[], torch.Tensor]:
    """The same layer with its GEMMs under ``recipe`` (FP8 against our bf16)."""

    def run() -> torch.Tensor:
        with fuseops.autocast(recipe=recipe):
            return layer()

    return run


def implementations(case: Case, names=IMPLS) -> dict[str, Callable[[], torch.Tensor]]:
    impls = {"fuseops": fuseops_layer(case), "fuseops lean": fuseops_layer(case, lean=True),
             "fuseops composed": composed_layer(case), "torch": torch_layer(case)}
    impls["fuseops fp8"] = quantized(composed_layer(case), fuseops.recipes.FP8CurrentScaling())
    impls["fuseops fp8 blk"] = quantized(composed_layer(case), fuseops.recipes.FP8Blockwise())
    impls["fuseops fp8 layer"] = quantized(fuseops_layer(case), fuseops.recipes.FP8CurrentScaling())
    impls["fuseops fp8 blk layer"] = quantized(fuseops_layer(case), fuseops.recipes.FP8Blockwise())
    if "liger" in names:
        try:
            impls["liger"] = liger_layer(case)
        except ImportError as exc:
            print(f"liger skipped: {exc}", flush=True)
    try:
        import fuseops.integrations.transformers as fx

        fx.register()
        impls["hf grouped_mm"] = hf_layer(case, "grouped_mm")
        impls["hf fuseops"] = hf_layer(case, "fuseops")
    except ImportError as exc:
        print(f"transformers baselines skipped: {exc}", flush=True)
    return {name: layer for name, layer in impls.items() if name in names or name == "torch"}


def forward_backward(case: Case, layer: Callable[[], torch.Tensor]) -> Callable[[], None]:
    return lambda: layer().backward(case.dy)


def set_grads_to_none(case: Case) -> None:
    for t in case.leaves():
        t.grad = None


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def agreement(case: Case, impls: dict) -> dict[str, dict[str, float]]:
    """Output and gradients of each implementation against plain torch (relative errors); an
    implementation that fails is reported and dropped from ``impls``."""
    results = {}
    for name, layer in list(impls.items()):
        set_grads_to_none(case)
        try:
            y = layer()
            y.backward(case.dy)
        except Exception as exc:  # report a failing baseline, keep the others
            print(f"  {name}: {exc!r}"[:300], flush=True)
            del impls[name]
            continue
        results[name] = {"y": y.detach(), **{n: t.grad for n, t in zip(("dx", "dweights", "dw1", "dw2"), case.leaves())}}
    set_grads_to_none(case)
    ref = results["torch"]
    return {name: {k: _rel_err(v, ref[k]) for k, v in got.items()} for name, got in results.items()}


def bench_ms(fn: Callable[[], object], case: Case, args) -> float:
    if args.smoke:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    if args.timing == "do_bench":
        import triton

        return triton.testing.do_bench(fn, warmup=max(25, args.rep // 4), rep=args.rep, grad_to_none=case.leaves(),
                                       return_mode="median")
    return sustained_ms(fn, warmup_s=args.warmup_s, steps=args.steps, before=lambda: set_grads_to_none(case))


def peak_memory_gb(case: Case, fn: Callable[[], object]) -> tuple[float, float]:
    """(peak, peak above what was allocated before) in GB over one call of ``fn``."""
    set_grads_to_none(case)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    set_grads_to_none(case)
    return peak / 1e9, (peak - base) / 1e9


def tflops(shape: dict, mode: str, ms: float) -> float:
    flops = 6.0 * shape["T"] * shape["K"] * shape["H"] * shape["I"] * (3 if mode == "fwd+bwd" else 1)
    return flops / (ms * 1e-3) / 1e12


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


def run_benchmark(args) -> tuple[list[dict], dict]:
    rows, extra = [], {}
    shapes = SMOKE_SHAPES if args.smoke else {name: SHAPES[name] for name in args.shapes}
    for shape_name, shape in shapes.items():
        print(f"\n{shape_name} {shape}", flush=True)
        case = make_case(**shape, device="cpu" if args.smoke else "cuda")
        impls = implementations(case, args.impls)
        errs = agreement(case, impls)
        for name, e in errs.items():
            print(f"  {name:<14} rel err vs torch: " + " ".join(f"{k} {v:.1e}" for k, v in e.items()), flush=True)
        nan = (float("nan"), float("nan"))
        memory = {name: nan if args.smoke else peak_memory_gb(case, forward_backward(case, layer))
                  for name, layer in impls.items()}
        for name, (peak, delta) in memory.items():
            print(f"  {name:<14} fwd+bwd peak memory {peak:6.2f} GB ({delta:+.2f} GB above the step's start)", flush=True)
        for mode in MODES:
            fns = {n: (layer if mode == "fwd" else forward_backward(case, layer)) for n, layer in impls.items()}
            times: dict[str, list[float]] = {n: [] for n in fns}
            for r in range(args.rounds):
                for name, fn in fns.items():
                    try:
                        times[name].append(bench_ms(fn, case, args))
                    except Exception as exc:  # report a failing baseline, keep the others
                        print(f"  {mode} {name}: {exc!r}"[:300], flush=True)
                print(f"  {mode} round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{n} {tflops(shape, mode, ts[-1]):.0f}" for n, ts in times.items() if ts) + " TFLOP/s", flush=True)
            for name, ts in times.items():
                if ts:
                    ms = sorted(ts)[len(ts) // 2]
                    rows.append(dict(shape=shape_name, **shape, mode=mode, impl=name, ms=ms,
                                     tflops=tflops(shape, mode, ms), peak_gb=memory[name][0],
                                     peak_above_inputs_gb=memory[name][1], rel_err_vs_torch=errs[name]))
        # The timing closures hold the case, and the last timed call left its gradients: both
        # would count in the next shape's peak memory (2.82 GB at Mixtral after Qwen3: Qwen3's
        # tensors and gradients).
        set_grads_to_none(case)
        del case, impls, fns
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


def print_table(rows: list[dict], extra: dict) -> None:
    by = {(r["shape"], r["mode"], r["impl"]): r for r in rows}
    print("\nMoE expert layer, bf16: TFLOP/s (6*T*K*H*I per fwd, x3 per fwd+bwd); fwd+bwd peak memory")
    print("above the step's start (GB), and each against plain torch in the same run")
    head = (f"{'shape':<15}{'impl':<18}{'fwd':>8}{'fwd+bwd':>9}{'peak above start':>18}{'peak total':>12}"
            f"{'speed vs torch':>16}{'peak vs torch':>15}")
    print(head)
    print("-" * len(head))
    for shape in dict.fromkeys(r["shape"] for r in rows):
        torch_row = by.get((shape, "fwd+bwd", "torch"), {})
        for impl in IMPLS:
            fb = by.get((shape, "fwd+bwd", impl))
            if fb is None:
                continue
            fwd = by.get((shape, "fwd", impl), {}).get("tflops", float("nan"))
            speed = fb["tflops"] / torch_row["tflops"] if torch_row else float("nan")
            peak = fb["peak_above_inputs_gb"] / torch_row["peak_above_inputs_gb"] if torch_row else float("nan")
            print(f"{shape:<15}{impl:<18}{fwd:>8.0f}{fb['tflops']:>9.0f}{fb['peak_above_inputs_gb']:>18.2f}"
                  f"{fb['peak_gb']:>12.2f}{speed:>16.2f}{peak:>15.2f}")
    for key in ("cuda_graph_default", "cuda_graph_lean"):
        if key in extra:
            print(f"CUDA graph ({key.removeprefix('cuda_graph_')}, fwd+bwd replayed with new routing): {extra[key]}")


def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    panels = [("fwd", "tflops", "forward TFLOP/s"), ("fwd+bwd", "tflops", "forward+backward TFLOP/s"),
              ("fwd+bwd", "peak_above_inputs_gb", "fwd+bwd peak above the step's start, GB")]
    fig, axes = plt.subplots(1, len(panels), figsize=(16, 4.5))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    width = 0.8 / len(IMPLS)
    for ax, (mode, field, title) in zip(axes, panels):
        for i, impl in enumerate(IMPLS):
            vals = [next((r[field] for r in rows if r["shape"] == s and r["mode"] == mode and r["impl"] == impl), 0)
                    for s in shapes]
            ax.bar([j + width * (i - (len(IMPLS) - 1) / 2) for j in range(len(shapes))], vals, width, label=impl)
        ax.set_xticks(range(len(shapes)), shapes)
        ax.set_title(f"{title} (bf16)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
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
    parser.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph capture check")
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny shape, one round, no memory: checks it runs")
    parser.add_argument("--out-dir", type=Path, help="default benchmarks/results (with --smoke the temp dir)")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    import triton

    start = time.time()
    rows, extra = run_benchmark(args)
    out_dir = args.out_dir or (Path(tempfile.gettempdir()) if args.smoke else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(device="cpu" if args.smoke else torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, timing="smoke" if args.smoke else args.timing)
    try:
        import transformers

        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    path = results_path("moe_layer", "", device="cpu" if args.smoke else "cuda", directory=out_dir)
    path.with_suffix(".json").write_text(json.dumps(dict(**meta, **extra, rows=rows), indent=1))
    plot(rows, path.with_suffix(".png"))
    print(f"results: {path.with_suffix('.json')}")
    print(f"\n({time.time() - start:.0f} s)")
    print_table(rows, extra)


if __name__ == "__main__":
    main()
