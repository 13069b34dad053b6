"""Quantized compute on the GPU: quantize bandwidth, and FP8 grouped GEMMs against torch.

    python -m benchmarks.quantize [--out DIR] [--tune] [--budget SECONDS] [--quantize-only]

1. ``fuseops.quant.quantize`` of a bf16 activation [16384, 4096] (and the same rows grouped
   into 8 experts) in every recipe, row-wise alone and with the column-wise copy, against a
   device-to-device copy of the input. GB/s counts the input read once plus every buffer
   written; per-tensor formats (FP8 current scaling, NVFP4) also read the input in an amax
   pass first, which the figure does not count (``reads`` says how many passes; the amax
   pass alone is its own row, bytes read over time; so is the FP8 current-scaling cast
   given the amax, what a producer that emits its output's amax leaves). Each case is
   timed eagerly and replayed from a CUDA graph (the GPU's time without Python and launch
   overhead, which a training step hides behind the GPU's queue).
2. Grouped GEMMs at E=8, T=16384, H=4096, F=14336 (uniform routing): forward, dgrad and wgrad
   under FP8 current scaling against ``torch._scaled_grouped_mm`` with row-wise scales (and
   our kernel with the same row-wise operands), plus FP8 blockwise and the emulated MXFP8 /
   NVFP4 forward, and bf16 ``torch._grouped_mm`` as a yardstick. TFLOP/s = 2*T*H*F / time.
   ``--quantize-only`` leaves them out (and their --tune sweep).

All timings are ``triton.testing.do_bench`` medians in one process. Writes
``quantize-<gpu>-<date>.json`` under --out (default ``benchmarks/results``); with --tune it first
times tile candidates, uses the best ones, prints the quantize and amax tables to copy into the
kernels' ``_configs`` and writes its log to ``quantize_tune.json`` under the temp dir.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import torch
import triton

from benchmarks._results import RESULTS, results_path
from benchmarks._timing import capture_cuda_graph
from benchmarks.plot import plot_file
from fuseops.kernels.gemm import dense_scaled as gs
from fuseops.kernels.gemm import grouped_scaled as ggs
from fuseops.kernels.gemm import grouped_scaled_wgrad as ggsw
from fuseops.kernels.gemm.grouped import GemmConfig, group_offsets
from fuseops.kernels.quantization import amax as ka
from fuseops.kernels.quantization import quantize as kq
from fuseops.kernels.quantization.formats import Scaling, tensor_encode_scale
from fuseops.quant import linear_dgrad, linear_forward, quantize, recipes

E, T, H, F = 8, 16384, 4096, 14336
DEVICE = "cuda"
RECIPES = {"fp8_current": recipes.FP8CurrentScaling(), "fp8_blockwise": recipes.FP8Blockwise(),
           "mxfp8": recipes.MXFP8(), "nvfp4": recipes.NVFP4()}
# Tile candidates of the --tune sweep: all compile for sm_90 without spills (cuobjdump).
GEMM_CANDIDATES = {
    Scaling.TENSOR: [GemmConfig(128, 256, 128, 8, 8, 3), GemmConfig(128, 256, 128, 8, 8, 4),
                     GemmConfig(128, 256, 128, 8, 8, 3, flatten=False),
                     GemmConfig(128, 128, 128, 8, 8, 4), GemmConfig(64, 256, 128, 8, 4, 4)],
    Scaling.BLOCK: [GemmConfig(128, 128, 128, 8, 8, 3, flatten=False),
                    GemmConfig(128, 128, 128, 8, 8, 4, flatten=False), GemmConfig(64, 128, 128, 8, 4, 4)],
}
WGRAD_CANDIDATES = {
    Scaling.TENSOR: [GemmConfig(128, 128, 256, 1, 8, 3), GemmConfig(128, 256, 128, 1, 8, 3),
                     GemmConfig(128, 128, 256, 1, 8, 4), GemmConfig(128, 128, 128, 1, 8, 4)],
    Scaling.BLOCK: [GemmConfig(128, 128, 128, 1, 8, 4), GemmConfig(128, 128, 128, 1, 8, 3),
                    GemmConfig(128, 64, 128, 1, 4, 3, programs_per_sm=2)],
}
# Quantize tilings by recipe (QuantizeConfig: block_r, block_c, num_warps, staged, group_r,
# maxnreg); each compiled for sm_90 without spills when listed (ptxas -v, registers noted; the
# K=16 tiles near the limit). Row-wise alone: the measured best and its grouped launch order.
# With the column-wise copy: the measured best alone, grouped and staged, then staged tiles of
# 8-row chunks (64 values a thread, 107-127 registers) and of 4-row chunks (32 values, 59-76
# registers). Since the rare path of the non-finite rules (quantize.py), the library's staged
# tiles carry a register cap; each is also listed uncapped (BLOCK 167 registers, MX 94, NVFP4
# 144). BLOCK row-wise: the library's 8 warps (71 registers), the 4 warps before it (154
# registers now) and those capped at 128 (4 bytes spilled).
Q = kq.QuantizeConfig
ROWWISE_CANDIDATES = {
    "fp8_blockwise": [Q(128, 128, 4), Q(128, 128, 4, group_r=8), Q(128, 128, 4, group_r=8, maxnreg=128),
                      Q(128, 128, 8, group_r=8)],
    "mxfp8": [Q(32, 256, 4), Q(32, 256, 4, group_r=8), Q(64, 128, 4, group_r=8)],
    "nvfp4": [Q(32, 128, 4), Q(32, 128, 4, group_r=8), Q(32, 256, 4, group_r=8)],
    "fp8_current": [Q(32, 256, 4), Q(128, 128, 4)],
}
COLUMNWISE_CANDIDATES = {
    # 209-239 registers at 4 warps (2 programs per SM); 108 and 60 at 8 and 16 warps, whose
    # 16- and 8-byte column runs from registers (0.139 ms at (128, 128, 8)) staging widens.
    "fp8_blockwise": [Q(128, 128, 4), Q(128, 128, 4, group_r=8), Q(128, 128, 4, True, 8), Q(128, 128, 8, True, 0),
                      Q(128, 128, 8, True, 8), Q(128, 128, 8, True, 8, 128), Q(128, 128, 16, True, 8)],
    # 108-118 registers at (128, 64, 4), 108 / 64 / 59 for the staged 8- and 16-warp tiles.
    "mxfp8": [Q(128, 64, 4), Q(128, 64, 4, group_r=8), Q(128, 64, 4, True, 8), Q(128, 128, 8, True, 8),
              Q(128, 64, 8, True, 8), Q(128, 64, 8, True, 8, 64), Q(128, 128, 16, True, 8)],
    # From registers 4 packed bytes a thread, 16-byte runs; staged, whole 64-byte column
    # segments (32 for 64-row tiles). 126-128 registers with 8-row chunks, 76 with 4-row ones.
    "nvfp4": [Q(128, 64, 4), Q(128, 64, 4, True, 0), Q(128, 64, 4, True, 8), Q(128, 128, 8, True, 8),
              Q(64, 128, 4, True, 8), Q(128, 64, 8, True, 8), Q(128, 64, 8, True, 8, 80), Q(128, 64, 8, True, 8, 128)],
    "fp8_current": [Q(128, 128, 4), Q(128, 64, 4)],
}
# Amax tilings: 3 tiles in flight (63 registers) and the unpipelined loop it replaced.
AMAX_CANDIDATES = [ka.AmaxConfig(32, 128, 16, 4, 4), ka.AmaxConfig(32, 128, 16, 3, 4), ka.AmaxConfig(64, 128, 8, 3, 4),
                   ka.AmaxConfig(32, 128, 16, 4, 8), ka.AmaxConfig(64, 64, 16, 4, 4), ka.AmaxConfig(64, 128, 8, 1, 4)]


def checked(fn, out: kq.Buffers, ref: kq.Buffers):
    """``fn``, once it has written ``out`` (poisoned first) bit for bit as ``ref``: a tiling is
    timed only if its output is right."""
    for t in out:
        if t is not None:
            t.view(torch.uint8).fill_(0xFF)
    fn()
    for name, o, r in zip(kq.Buffers._fields, out, ref):
        if o is not None and not torch.equal(o.view(torch.uint8), r.view(torch.uint8)):
            raise ValueError(f"{name} differs from reference_quantize")
    return fn


def bench(fn, rep: int = 50) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def graph_ms(fn) -> float | None:
    """Milliseconds per call of ``fn`` replayed from a CUDA graph: the GPU's time alone. A
    quantize call is a few short kernels (tens of microseconds at this shape), so eager timing
    also measures Python and launch overhead, which a training step overlaps with the GPU's
    work in flight. None if the capture fails."""
    try:
        graph, _ = capture_cuda_graph(fn, warmup=1)
        return bench(graph.replay)
    except Exception as exc:
        print(f"graph capture failed: {exc!r}"[:200], flush=True)
        return None


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def quantize_rows(x: torch.Tensor, offsets: torch.Tensor) -> list[dict]:
    y = torch.empty_like(x)
    copy_ms = bench(lambda: y.copy_(x))
    copy_gbps = 2 * nbytes(x) / copy_ms / 1e6
    copy_graph_ms = graph_ms(lambda: y.copy_(x))
    rows = [dict(case="copy", ms=copy_ms, gbps=copy_gbps, ratio_vs_copy=1.0, graph_ms=copy_graph_ms,
                 graph_ratio_vs_copy=1.0)]
    x3 = x[None]
    a_ms, a_graph_ms = bench(lambda: ka.amax(x3, None, 1)), graph_ms(lambda: ka.amax(x3, None, 1))
    rows.append(dict(case="amax pass (read only)", ms=a_ms, gbps=nbytes(x) / a_ms / 1e6,
                     ratio_vs_copy=nbytes(x) / a_ms / 1e6 / copy_gbps, graph_ms=a_graph_ms,
                     graph_ratio_vs_copy=copy_graph_ms / (2 * a_graph_ms) if a_graph_ms and copy_graph_ms else None))
    print(rows[-1], flush=True)
    rows += cast_given_amax_rows(x3, copy_gbps, copy_graph_ms)
    for name, recipe in RECIPES.items():
        for role in ("input", "weight") if name == "fp8_blockwise" else ("input",):
            for grouped in (False, True):
                if grouped and role == "weight":
                    continue
                for columnwise in (False, True):
                    fn = lambda: quantize(x, recipe, role=role, columnwise=columnwise,  # noqa: E731
                                          offsets=offsets if grouped else None)
                    q = fn()
                    ms = bench(fn)
                    moved = nbytes(x) + nbytes(*q.data_tensors())
                    gbps = moved / ms / 1e6
                    g_ms = graph_ms(fn)
                    # Bytes over time against the copy's, both replayed from graphs.
                    g_ratio = moved * copy_graph_ms / (2 * nbytes(x) * g_ms) if g_ms and copy_graph_ms else None
                    rows.append(dict(case=f"{name} {role}{' grouped' if grouped else ''}"
                                     f"{' +columnwise' if columnwise else ''}", ms=ms, gbps=gbps,
                                     reads=2 if q.tensor_scale is not None else 1,
                                     ratio_vs_copy=gbps / copy_gbps, graph_ms=g_ms, graph_ratio_vs_copy=g_ratio))
                    print(rows[-1], flush=True)
    return rows


def cast_given_amax_rows(x3: torch.Tensor, copy_gbps: float, copy_graph_ms: float | None) -> list[dict]:
    """The FP8 current-scaling cast alone, its encode scale computed beforehand: what a
    producer that emits its output's amax leaves, row-wise, and with the column-wise copy."""
    fmt = RECIPES["fp8_current"].format("input")
    enc = tensor_encode_scale(ka.amax(x3, None, 1), fmt.scaling, fmt.element)
    rows = []
    for columnwise in (False, True):
        def fn(columnwise: bool = columnwise):
            return kq.quantize(x3, None, enc, scaling=fmt.scaling, element=fmt.element, block_2d=False,
                               rowwise=True, columnwise=columnwise)
        moved = nbytes(x3) + nbytes(*[t for t in fn() if t is not None])
        ms, g_ms = bench(fn), graph_ms(fn)
        g_ratio = moved * copy_graph_ms / (2 * nbytes(x3) * g_ms) if g_ms and copy_graph_ms else None
        rows.append({"case": f"fp8_current cast given amax{' +columnwise' if columnwise else ''}", "ms": ms,
                     "gbps": moved / ms / 1e6, "reads": 1, "ratio_vs_copy": moved / ms / 1e6 / copy_gbps,
                     "graph_ms": g_ms, "graph_ratio_vs_copy": g_ratio})
        print(rows[-1], flush=True)
    return rows


def rowwise_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float8 E4M3 rows of ``x`` [..., K] with one float32 scale per row (for torch's API)."""
    scale = x.float().abs().amax(-1).clamp(min=1e-12) / 448.0
    return (x.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def gemm_rows(cfgs: dict) -> list[dict]:
    dev, bf16 = DEVICE, torch.bfloat16
    sizes = [T // E] * E
    offsets = group_offsets(torch.tensor(sizes, device=dev))
    offs32 = offsets[1:].to(torch.int32)
    x = torch.randn(T, H, device=dev, dtype=bf16)
    w = (torch.randn(E, F, H, device=dev) / math.sqrt(H)).to(bf16)
    dy = torch.randn(T, F, device=dev, dtype=bf16)
    flops = 2.0 * T * H * F
    rows, outputs = [], {}

    def add(op, impl, fn):
        try:
            outputs[(op, impl)] = fn()
            ms = bench(fn)
            rows.append(dict(op=op, impl=impl, ms=ms, tflops=flops / ms / 1e9))
        except Exception as exc:  # a baseline missing from this torch build
            rows.append(dict(op=op, impl=impl, error=repr(exc)[:300]))
        print(rows[-1], flush=True)

    # Row-wise operands, as torch._scaled_grouped_mm takes them.
    xr, sx = rowwise_fp8(x)
    wr, sw = rowwise_fp8(w)
    dyr, sdy = rowwise_fp8(dy)
    wtr, swt = rowwise_fp8(w.transpose(1, 2).contiguous())
    add("forward", "torch._scaled_grouped_mm rowwise",
        lambda: torch._scaled_grouped_mm(xr, wr.transpose(-2, -1), sx, sw, offs=offs32, out_dtype=bf16))
    add("dgrad", "torch._scaled_grouped_mm rowwise",
        lambda: torch._scaled_grouped_mm(dyr, wtr.transpose(-2, -1), sdy, swt, offs=offs32, out_dtype=bf16))
    fwd_cfg = cfgs.get("forward", gs.pick_config(Scaling.TENSOR, True))
    a = gs.Operand(xr, outer=sx, outer_per_row=True)
    b = gs.Operand(wr, outer=sw, outer_per_row=True)
    add("forward", "fuseops rowwise",
        lambda: ggs.launch_grouped_gemm_scaled(a, b, offsets, Scaling.TENSOR, bf16, None, None, fwd_cfg))
    add("forward", "torch._grouped_mm bf16", lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs32))

    for name, recipe in RECIPES.items():
        xq = quantize(x, recipe, columnwise=True, offsets=offsets)
        wq = quantize(w, recipe, role="weight", columnwise=True)
        scaling = xq.format.scaling
        a, b = xq.rowwise_operand(), wq.rowwise_operand()
        cfg = cfgs.get("forward" if scaling == Scaling.TENSOR else f"forward {name}", gs.pick_config(scaling, True))
        # Blockwise: the library's dispatch (the warp-specialized Gluon kernels on sm_90) and,
        # beside it, the Triton kernel with the tile config (what --tune sweeps).
        triton_kernel = " (Triton kernel)" if scaling == Scaling.BLOCK else ""
        if scaling == Scaling.BLOCK:
            add("forward", f"fuseops {name}", lambda: linear_forward(xq, wq))
        add("forward", f"fuseops {name}{triton_kernel}",
            lambda: ggs.launch_grouped_gemm_scaled(a, b, offsets, scaling, bf16, None, None, cfg))
        if name in ("fp8_current", "fp8_blockwise"):
            dyq = quantize(dy, recipe, role="grad", columnwise=True, offsets=offsets)
            add("dgrad", f"fuseops {name}", lambda: linear_dgrad(dyq, wq))
            wcfg = cfgs.get(f"wgrad {name}", ggsw.pick_wgrad_config(scaling, False))
            at, bt = dyq.columnwise_operand(), xq.columnwise_operand()
            if scaling == Scaling.BLOCK:
                add("wgrad", f"fuseops {name}",
                    lambda: ggsw.grouped_gemm_scaled_wgrad(at, bt, offsets, scaling=scaling, out_dtype=bf16))
            add("wgrad", f"fuseops {name}{triton_kernel}",
                lambda: ggsw.launch_grouped_gemm_scaled_wgrad(at, bt, offsets, scaling, bf16, None, None, wcfg))
            if name == "fp8_current":
                ref = torch.cat([x[i * (T // E):(i + 1) * (T // E)].float() @ w[i].float().T for i in range(E)])
                y = linear_forward(xq, wq)
                rows.append(dict(op="forward", impl="fp8_current sqnr_db vs bf16 inputs",
                                 sqnr_db=10 * math.log10(ref.square().sum().item() / (y.float() - ref).square().sum().item())))
    ours, theirs = outputs.get(("forward", "fuseops rowwise")), outputs.get(("forward", "torch._scaled_grouped_mm rowwise"))
    if ours is not None and theirs is not None:
        err = ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()
        rows.append(dict(op="forward", impl="rowwise rel_err fuseops vs torch", rel_err=err))
    return rows


def tune(budget: float, gemms: bool = True) -> tuple[dict, list[dict]]:
    """Time the quantize, amax and GEMM tile candidates; the best per kind, and every timing."""
    dev, bf16 = DEVICE, torch.bfloat16
    offsets = group_offsets(torch.tensor([T // E] * E, device=dev))
    x = torch.randn(T, H, device=dev, dtype=bf16)
    w = torch.randn(E, F, H, device=dev, dtype=bf16)
    dy = torch.randn(T, F, device=dev, dtype=bf16)
    start, best, log = time.time(), {}, []

    def sweep(kind, candidates, make_fn):
        times = {}
        for cfg in candidates:
            if time.time() - start > budget:
                break
            try:
                times[cfg] = bench(make_fn(cfg), rep=30)
            except Exception as exc:
                log.append(dict(kind=kind, cfg=str(cfg), error=repr(exc)[:200]))
                continue
            log.append(dict(kind=kind, cfg=str(cfg), ms=times[cfg]))
            print(f"{kind:<28}{cfg}  {times[cfg]:.3f} ms", flush=True)
        if times:
            best[kind] = min(times, key=times.get)

    # Quantize and amax first (the block-scaled formats before FP8 current scaling, whose cast is
    # at the copy's speed already): the GEMM sweeps take what the budget leaves.
    x3 = x[None]
    for name in ROWWISE_CANDIDATES:
        fmt = RECIPES[name].format("input")
        enc = None
        if fmt.scaling in (Scaling.TENSOR, Scaling.NVFP4):
            enc = tensor_encode_scale(ka.amax(x3, None, 1), fmt.scaling, fmt.element)
        for columnwise, candidates in ((False, ROWWISE_CANDIDATES[name]), (True, COLUMNWISE_CANDIDATES[name])):
            kw = dict(scaling=fmt.scaling, element=fmt.element, rowwise=True, columnwise=columnwise)
            out = kq.allocate(tuple(x3.shape), None, block_2d=False, device=x.device, **kw)
            ref = kq.reference_quantize(x3, None, enc, **kw)
            sweep(f"quantize {name}{' +columnwise' if columnwise else ''}", candidates,
                  lambda c: checked(lambda: kq.launch_quantize(x3, None, enc, fmt.scaling, fmt.element, False, True,
                                                               columnwise, out, c), out, ref))
    sweep("amax", AMAX_CANDIDATES, lambda c: lambda: ka.launch_amax(x3, None, 1, c))
    for name in ("fp8_current", "fp8_blockwise") if gemms else ():
        recipe = RECIPES[name]
        xq = quantize(x, recipe, columnwise=True, offsets=offsets)
        wq = quantize(w, recipe, role="weight")
        dyq_t = quantize(dy, recipe, role="grad", rowwise=False, columnwise=True, offsets=offsets)
        s = xq.format.scaling
        a, b = xq.rowwise_operand(), wq.rowwise_operand()
        kind = "forward" if s == Scaling.TENSOR else f"forward {name}"
        sweep(kind, GEMM_CANDIDATES[s],
              lambda c: lambda: ggs.launch_grouped_gemm_scaled(a, b, offsets, s, bf16, None, None, c))
        at, bt = dyq_t.columnwise_operand(), xq.columnwise_operand()
        sweep(f"wgrad {name}", WGRAD_CANDIDATES[s],
              lambda c: lambda: ggsw.launch_grouped_gemm_scaled_wgrad(at, bt, offsets, s, bf16, None, None, c))
    return best, log


def use_tuned_tiles(best: dict) -> None:
    """Run the rest of the benchmark with the tuned quantize tiles and amax tiling (in place of
    the kernels' tables, this process only), and print them for the kernels' ``_configs``."""
    names = {"fp8_current": Scaling.TENSOR, "fp8_blockwise": Scaling.BLOCK, "mxfp8": Scaling.MX, "nvfp4": Scaling.NVFP4}
    table = dict(kq._configs())
    for name, scaling in names.items():
        for columnwise in (False, True):
            table[scaling, columnwise] = best.get(f"quantize {name}{' +columnwise' if columnwise else ''}",
                                                  table[scaling, columnwise])
    kq._configs = lambda: table
    print("\ntuned quantize tiles:", {f"{s.name}, {c}": v for (s, c), v in table.items()}, flush=True)
    if "amax" in best:
        ka._config = lambda: best["amax"]
        print("tuned amax tiling:", best["amax"], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(RESULTS), help="directory (default benchmarks/results)")
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for the --tune sweep")
    parser.add_argument("--quantize-only", action="store_true", help="leave the grouped GEMMs out")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfgs = {}
    if args.tune:
        best, log = tune(args.budget, gemms=not args.quantize_only)
        cfgs = {k: v for k, v in best.items() if not k.startswith(("quantize", "amax"))}
        use_tuned_tiles(best)
        tune_log = Path(tempfile.gettempdir()) / "quantize_tune.json"
        tune_log.write_text(json.dumps(dict(best={k: str(v) for k, v in best.items()}, log=log), indent=1))
        print(f"tune log: {tune_log}", flush=True)
    x = torch.randn(T, H, device=DEVICE, dtype=torch.bfloat16)
    offsets = group_offsets(torch.tensor([T // E] * E, device=DEVICE))
    result = dict(device=torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, shape=dict(E=E, T=T, H=H, F=F),
                  quantize=quantize_rows(x, offsets), grouped_gemm=[] if args.quantize_only else gemm_rows(cfgs))
    path = results_path("quantize", directory=out)
    path.write_text(json.dumps(result, indent=1))
    plot_file(path)
    print(f"\nquantize [{T}, {H}] bf16 (GB/s and ratio to copy, eager; ratio timed from a CUDA graph)")
    for r in result["quantize"]:
        graph = r.get("graph_ratio_vs_copy")
        print(f"  {r['case']:<44}{r['gbps']:>8.0f}{r['ratio_vs_copy']:>7.2f}"
              + (f"{graph:>7.2f}" if graph else f"{'-':>7}"))
    print(f"\ngrouped GEMM E={E} T={T} H={H} F={F} (TFLOP/s)")
    for r in result["grouped_gemm"]:
        value = r.get("tflops", r.get("rel_err", r.get("sqnr_db", r.get("error"))))
        print(f"  {r['op']:<9}{r['impl']:<40}{value if isinstance(value, str) else f'{value:.4g}'}")


if __name__ == "__main__":
    main()
