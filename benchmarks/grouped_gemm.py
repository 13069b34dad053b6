"""Grouped GEMM for MoE experts: fuseops against torch._grouped_mm and a per-expert loop.

Forward ``x[T, H] @ W[E, F, H]^T -> [T, F]``, dgrad ``dy[T, F] @ W -> [T, H]`` and wgrad
``dy_e^T @ x_e -> [E, F, H]`` (``wgrad+mg``: added in float32 into a ``main_grad``; torch's
baseline is grouped_mm then ``main_grad.add_``), bf16, each counted as 2*T*H*F flops, at the
MoE shapes below (E=8 Mixtral-like to E=128 Qwen3-like) with uniform routing and skewed routing
(expert 0 takes half the rows).
All implementations run in the same process on the same tensors, timed in interleaved rounds
(median of rounds) so that clock drift does not favour one; a dense cuBLAS matmul of the same
total size is the ceiling.

    python -m benchmarks.grouped_gemm                # table; grouped_gemm-<gpu>-<date>.json and .png under benchmarks/results
    python -m benchmarks.grouped_gemm --tune         # sweep tile configs, print the best table
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton

from benchmarks._results import RESULTS, pyplot, results_path
from fuseops.kernels.gemm.grouped import GemmConfig, group_offsets, launch_grouped_gemm, pick_config
from fuseops.kernels.gemm.grouped_wgrad import grouped_gemm_wgrad, launch_grouped_gemm_wgrad, pick_wgrad_config

SHAPES = [(8, 16384, 4096, 14336), (32, 16384, 4096, 2048), (64, 32768, 2048, 1408), (128, 65536, 2048, 768)]
ROUTINGS = ("uniform", "skewed")
OPS = ("forward", "dgrad", "wgrad", "wgrad+mg")
IMPLS = ("fuseops", "torch._grouped_mm", "loop", "dense", "fuseops (Triton kernel)")

# Candidates of the offline sweep (block_m, block_n, block_k, group_m, warps, stages, flatten,
# split_epilogue); all compile for sm_90 within SMEM and without spills.
GEMM_CANDIDATES = [
    GemmConfig(128, 256, 64, 8, 8, 3),
    GemmConfig(128, 256, 64, 8, 8, 3, flatten=False),
    GemmConfig(128, 256, 64, 8, 8, 4, split_epilogue=True),
    GemmConfig(128, 256, 64, 8, 8, 4, flatten=False, split_epilogue=True),
    GemmConfig(128, 256, 64, 4, 8, 4, split_epilogue=True),
    GemmConfig(128, 256, 64, 8, 8, 3, split_epilogue=True),
    GemmConfig(128, 256, 64, 16, 8, 3),
]
WGRAD_CANDIDATES = [
    GemmConfig(64, 128, 256, 1, 8, 3),
    GemmConfig(64, 128, 256, 1, 8, 3, flatten=False),
    GemmConfig(64, 256, 128, 1, 8, 3, flatten=False),
]
ACCUMULATE_CANDIDATES = [
    GemmConfig(64, 128, 128, 1, 8, 4),
    GemmConfig(64, 128, 128, 1, 8, 4, flatten=False),
    GemmConfig(64, 128, 128, 1, 8, 3, flatten=False),
]


def split_sizes(E: int, T: int, routing: str) -> list[int]:
    """Rows per expert: T/E each, or expert 0 taking T/2 and the rest sharing the other half."""
    if routing == "uniform":
        return [T // E + (e < T % E) for e in range(E)]
    rest = T - T // 2
    return [T // 2] + [rest // (E - 1) + (e < rest % (E - 1)) for e in range(E - 1)]


def make_case(E: int, T: int, H: int, F: int, routing: str) -> dict:
    sizes = split_sizes(E, T, routing)
    dev, dt = "cuda", torch.bfloat16
    offsets = group_offsets(torch.tensor(sizes, device=dev))
    return dict(
        sizes=sizes,
        offsets=offsets,
        offs32=offsets[1:].to(torch.int32),
        x=torch.randn(T, H, device=dev, dtype=dt),
        w=torch.randn(E, F, H, device=dev, dtype=dt) / math.sqrt(H),
        dy=torch.randn(T, F, device=dev, dtype=dt),
    )


def implementations(case: dict, op: str, cfg: GemmConfig | None = None) -> dict:
    """Zero-argument callables per implementation of ``op`` on ``case``'s tensors (``cfg``: a
    Triton tile config to sweep, else the table's)."""
    tuned = cfg is not None
    x, w, dy, offsets, offs32 = case["x"], case["w"], case["dy"], case["offsets"], case["offs32"]
    bounds = [0]
    for s in case["sizes"]:
        bounds.append(bounds[-1] + s)
    spans = list(zip(bounds[:-1], bounds[1:]))
    if op == "forward":
        a, b, y = x, w.transpose(1, 2), torch.empty(x.shape[0], w.shape[1], device="cuda", dtype=x.dtype)
        cfg = cfg or pick_config(b.shape[2], a.dtype, True, False)

        def loop():
            for e, (s, t) in enumerate(spans):
                torch.mm(x[s:t], w[e].T, out=y[s:t])

        dense = lambda: torch.mm(x, w[0].T)  # noqa: E731
    elif op == "dgrad":
        a, b, y = dy, w, torch.empty_like(x)
        cfg = cfg or pick_config(b.shape[2], a.dtype, True, False)

        def loop():
            for e, (s, t) in enumerate(spans):
                torch.mm(dy[s:t], w[e], out=y[s:t])

        dense = lambda: torch.mm(dy, w[0])  # noqa: E731
    else:
        dw = torch.empty_like(w)
        main_grad = torch.zeros(w.shape, device="cuda") if op == "wgrad+mg" else None
        cfg = cfg or pick_wgrad_config(x.dtype, True, main_grad is not None)

        def loop():
            for e, (s, t) in enumerate(spans):
                torch.mm(dy[s:t].T, x[s:t], out=dw[e])

        dense = lambda: torch.mm(dy.T, x)  # noqa: E731
    # One matmul with the same T x H x F flops: the ceiling a grouped GEMM approaches.
    impls = {"loop": loop, "dense": dense}
    if op == "wgrad":
        if tuned:
            impls["fuseops"] = lambda: launch_grouped_gemm_wgrad(dy, x, offsets, None, dw, cfg)
        else:
            # What GroupedLinear calls: on sm_90 the warp-specialized kernel.
            impls["fuseops"] = lambda: grouped_gemm_wgrad(dy, x, offsets, out=dw)
            impls["fuseops (Triton kernel)"] = lambda: launch_grouped_gemm_wgrad(dy, x, offsets, None, dw, cfg)
        impls["torch._grouped_mm"] = lambda: torch._grouped_mm(dy.t(), x, offs=offs32)
    elif op == "wgrad+mg":
        triton_kernel = lambda: launch_grouped_gemm_wgrad(dy, x, offsets, main_grad, None, cfg)  # noqa: E731
        impls = {"torch._grouped_mm": lambda: main_grad.add_(torch._grouped_mm(dy.t(), x, offs=offs32))}
        if tuned:
            impls["fuseops"] = triton_kernel
        else:
            impls["fuseops"] = lambda: grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad)
            impls["fuseops (Triton kernel)"] = triton_kernel
    else:
        impls["fuseops"] = lambda: launch_grouped_gemm(
            a, b, offsets, None, None, 0, 1.0, False, None, y, cfg
        )
        impls["torch._grouped_mm"] = lambda: torch._grouped_mm(a, b, offs=offs32)
    return impls


def bench_ms(fn, rep: int) -> float:
    return triton.testing.do_bench(fn, warmup=max(5, rep // 4), rep=rep, return_mode="median")


def tflops(shape, ms: float) -> float:
    E, T, H, F = shape
    return 2.0 * T * H * F / (ms * 1e-3) / 1e12


def _progress(items, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, file=sys.stdout, mininterval=2.0)
    except ImportError:
        print(desc, flush=True)
        return items


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def run_benchmark(args) -> list[dict]:
    rows = []
    jobs = [(s, r) for s in SHAPES for r in ROUTINGS]
    for shape, routing in _progress(jobs, "benchmark"):
        case = make_case(*shape, routing)
        for op in OPS:
            impls = implementations(case, op)
            if routing == "skewed":
                impls.pop("dense", None)
            err = float("nan")
            if op != "wgrad+mg":
                # Outputs agree before anything is timed.
                ours, theirs = impls["fuseops"](), impls["torch._grouped_mm"]()
                err = _rel_err(ours[0] if isinstance(ours, tuple) else ours, theirs)
            times: dict[str, list[float]] = {name: [] for name in impls}
            for _ in range(args.rounds):
                for name, fn in impls.items():
                    try:
                        times[name].append(bench_ms(fn, args.rep))
                    except Exception as exc:  # a baseline missing from this torch build
                        print(f"{op} {name} {shape}: {exc!r}"[:300], flush=True)
            for name, ts in times.items():
                if ts:
                    ms = sorted(ts)[len(ts) // 2]
                    rows.append(dict(shape=list(shape), routing=routing, op=op, impl=name, ms=ms,
                                     tflops=tflops(shape, ms), rel_err_vs_torch=err))
        del case
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    by = {(tuple(r["shape"]), r["routing"], r["op"], r["impl"]): r["tflops"] for r in rows}
    print("\nTFLOP/s (bf16); ratio = fuseops / torch._grouped_mm")
    head = (f"{'E,T,H,F':<22}{'routing':<9}{'op':<10}{'fuseops':>9}{'torch':>9}{'loop':>8}{'dense':>8}"
            f"{'triton':>8}{'ratio':>8}")
    print(head)
    print("-" * len(head))
    for shape in SHAPES:
        for routing in ROUTINGS:
            for op in OPS:
                got = [by.get((shape, routing, op, i)) for i in IMPLS]
                if got[0] is None:
                    continue
                cells = "".join(f"{v:>9.0f}" if v else f"{'-':>9}" for v in got[:2])
                cells += "".join(f"{v:>8.0f}" if v else f"{'-':>8}" for v in got[2:])
                ratio = got[0] / got[1] if got[1] else float("nan")
                print(f"{','.join(map(str, shape)):<22}{routing:<9}{op:<10}{cells}{ratio:>8.2f}")


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(OPS), figsize=(18, 5), sharey=True)
    labels = [f"E={s[0]}\n{r}" for s in SHAPES for r in ROUTINGS]
    for ax, op in zip(axes, OPS):
        for i, impl in enumerate(IMPLS[:3]):
            vals = []
            for s in SHAPES:
                for r in ROUTINGS:
                    hit = [x["tflops"] for x in rows if tuple(x["shape"]) == s and x["routing"] == r
                           and x["op"] == op and x["impl"] == impl]
                    vals.append(hit[0] if hit else 0)
            ax.bar([j + 0.27 * (i - 1) for j in range(len(labels))], vals, width=0.27, label=impl)
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_title(f"{op} (bf16)")
        ax.set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_tune(args) -> None:
    """Time every candidate on every shape and routing against torch (interleaved rounds);
    print the geometric-mean ratio to torch per candidate and the best config per op."""
    sweeps = {"forward": GEMM_CANDIDATES, "dgrad": GEMM_CANDIDATES, "wgrad": WGRAD_CANDIDATES,
              "wgrad+mg": ACCUMULATE_CANDIDATES}
    ops = args.ops or list(sweeps)
    ratios: dict[tuple[str, GemmConfig], list[float]] = {}
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES
    start = time.time()
    for shape in shapes:
        for routing in ROUTINGS:
            if time.time() - start > args.budget:
                break
            case = make_case(*shape, routing)
            for op in ops:
                fns = {"torch": implementations(case, op)["torch._grouped_mm"]}
                fns.update({cfg: implementations(case, op, cfg)["fuseops"] for cfg in sweeps[op]})
                times: dict = {key: [] for key in fns}
                for _ in range(args.rounds):
                    for key, fn in fns.items():
                        try:
                            times[key].append(bench_ms(fn, args.rep))
                        except Exception as exc:
                            print(f"{op} {key}: {exc!r}"[:300], flush=True)
                med = {k: sorted(v)[len(v) // 2] for k, v in times.items() if v}
                for cfg in sweeps[op]:
                    if cfg in med:
                        ratios.setdefault((op, cfg), []).append(med["torch"] / med[cfg])
                        print(f"{op:<9}{str(shape):<26}{routing:<8} {tflops(shape, med[cfg]):6.0f} TFLOP/s "
                              f"x{med['torch'] / med[cfg]:5.2f}  {cfg}", flush=True)
            del case
            torch.cuda.empty_cache()
    print("\ngeometric mean of fuseops / torch._grouped_mm per candidate")
    best = {}
    for (op, cfg), rs in sorted(ratios.items(), key=lambda kv: kv[0][0]):
        gm = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{op:<9} x{gm:5.3f}  min x{min(rs):5.2f}  n={len(rs)}  {cfg}")
        if gm > best.get(op, (0, None))[0]:
            best[op] = (gm, cfg)
    print("\nbest table:")
    for op, (gm, cfg) in best.items():
        print(f"    {op!r}: {cfg},  # x{gm:.3f} geomean vs torch._grouped_mm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune", action="store_true", help="sweep tile configs instead of benchmarking")
    parser.add_argument("--ops", nargs="*", help="tune only these: forward dgrad wgrad wgrad+mg")
    parser.add_argument("--shapes", nargs="*", type=int, help="indices into SHAPES (tune only)")
    parser.add_argument("--rep", type=int, default=30, help="ms of timed repetitions per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per implementation")
    parser.add_argument("--budget", type=float, default=1e9, help="seconds after which tuning stops")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.tune:
        run_tune(args)
        return
    rows = run_benchmark(args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    path = results_path("grouped_gemm", "", directory=args.out_dir)
    path.with_suffix(".json").write_text(json.dumps(dict(**meta, rows=rows), indent=1))
    plot(rows, path.with_suffix(".png"))
    print_table(rows)


if __name__ == "__main__":
    main()
