"""The expert layer's GEMMs with their token rows gathered in the loads, against the same GEMMs
on a permuted copy: what reading ``x`` and ``dy`` through the routing's row map costs or saves,
per GEMM, at the MoE shapes, uniform and skewed routing (``benchmarks/moe_layer.py``'s cells), bf16.

Per shape and routing, for each GEMM a gather can feed (``fuseops.moe.expert_layer``'s lean
mode gathers in all five; its default mode reads copies, which these results chose):

- ``fc1_fwd``: FC1 with SwiGLU, the router weights and z saved (``grouped_gemm_gated``);
- ``fc2_dgrad``: FC2's dgrad through the gate (``grouped_gemm_dgrad_gated``: dz, dprobs, h);
- ``fc1_wgrad``: FC1's weight gradient from dz and the tokens (``grouped_gemm_wgrad``);
- ``fc2_wgrad``: FC2's weight gradient from the output gradient and h;
- ``fc1_recompute``: lean's FC1 again in the backward, z alone (``grouped_gemm``).

Variants: ``copy``, the permute kernel's copy of the rows and then the GEMM on it (for the
weight gradients the copy is not timed: ``copy`` is the GEMM alone); ``contiguous``, the GEMM
alone on the copy; ``gathered``, the GEMM reading the rows through the row map with its
launcher's table; and ``gathered <config>`` for each candidate tile in ``GATHERED_CONFIGS``
(a tile the card cannot hold is reported and left out). Every
variant's outputs are checked against ``contiguous``' (relative error by norm) before it is
timed; times are medians of interleaved ``do_bench`` rounds; ``x copy`` is the variant's time
over ``copy``'s. FLOP: 2*N*H*2I for FC1's GEMMs, 2*N*H*I for FC2's (N = T*K rows).

    python -m benchmarks.gathered_gemm                          # every cell (GPU)
    python -m benchmarks.gathered_gemm --shapes qwen3-30b-a3b --routing uniform --gemms fc1_fwd
    python -m benchmarks.gathered_gemm --smoke                  # CPU, tiny, end to end

Writes ``benchmarks/results/gathered_gemm-<gpu>-<date>.json`` (after every cell) and ``.png``
(``--out``; with ``--smoke`` the temp dir); prints a table last.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from benchmarks._results import pyplot, results_path
from benchmarks._timing import elapsed_ms, interleaved_medians
from benchmarks.moe_layer import CELL_SHAPES, ROUTINGS, SMOKE_SHAPES
from fuseops.kernels import library
from fuseops.kernels.dispatch import Kernel, launcher
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import grouped, grouped_wgrad
from fuseops.kernels.gemm import grouped_gated as ggg
from fuseops.kernels.gemm import grouped_gated_bwd as ggg_bwd
from fuseops.moe import permute
from fuseops.moe.expert_layer_steps import token_of_rows

GEMMS = ("fc1_fwd", "fc2_dgrad", "fc1_wgrad", "fc2_wgrad", "fc1_recompute")
# Candidate tiles for each GEMM's gathered loads (``nf``: the tile loop not flattened into the
# K loop; ``p2``: the epilogue on two column slices): timed beside the table's ``gathered`` entry.
_GATED = {
    "128x128 s3 p2 nf": ggg.GatedGemmConfig(128, 128, 64, 8, 8, 3, epilogue_parts=2, flatten=False),
    "128x128 s4 p2 nf": ggg.GatedGemmConfig(128, 128, 64, 8, 8, 4, epilogue_parts=2, flatten=False),
    "128x64 s5 nf": ggg.GatedGemmConfig(128, 64, 64, 8, 8, 5, flatten=False),
}
_WGRAD = {  # block_m is the reduction slab over the gathered rows
    "64x128x256 s5 nf": grouped.GemmConfig(64, 128, 256, 1, 8, 5, flatten=False),
    "64x256x128 s5 nf": grouped.GemmConfig(64, 256, 128, 1, 8, 5, flatten=False),
    "128x128x256 s4 nf": grouped.GemmConfig(128, 128, 256, 1, 8, 4, flatten=False),
}
_GROUPED = {
    "128x128x64 s4 nf": grouped.GemmConfig(128, 128, 64, 8, 8, 4, flatten=False),
    "128x256x64 s3 nf": grouped.GemmConfig(128, 256, 64, 8, 8, 3, flatten=False),
}
GATHERED_CONFIGS = {"fc1_fwd": _GATED, "fc2_dgrad": _GATED, "fc1_wgrad": _WGRAD, "fc2_wgrad": _WGRAD,
                    "fc1_recompute": _GROUPED}
SILU = Activation.SILU


def routing(T: int, E: int, K: int, skewed: bool, device: str) -> torch.Tensor:
    """Top-K of random logits; ``skewed``: every even token's first slot goes to expert 0 (the
    slot that held it takes the old first expert), as ``benchmarks/moe_layer.py`` routes."""
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randn(T, E, device=device, generator=g).topk(K, dim=-1).indices
    if skewed:
        even = ids[::2]
        even.copy_(torch.where(even == 0, even[:, :1], even))
        even[:, 0] = 0
    return ids


def gathered_copy(t: torch.Tensor, row_map: torch.Tensor) -> torch.Tensor:
    """``t``'s rows in the permuted order: the copy the default mode makes (permute's kernel)."""
    return launcher(Kernel.UNPERMUTE_BWD, t)(t, row_map, None, None)[0]


def variants(shape: dict, skewed: bool, gemm: str, device: str, tune: bool) -> tuple[dict[str, Callable], float]:
    """The variants of one GEMM at one cell (module docstring), and its FLOP."""
    E, T, H, I, K = shape["E"], shape["T"], shape["H"], shape["I"], shape["K"]
    kw = dict(device=device, dtype=torch.bfloat16)
    torch.manual_seed(0)
    x, dy = torch.randn(T, H, **kw), torch.randn(T, H, **kw)
    w1, w2 = torch.randn(E, 2 * I, H, **kw) / H**0.5, torch.randn(E, H, I, **kw) / I**0.5
    _, split_sizes, row_map = permute(x[:, :0], routing(T, E, K, skewed, device), E)
    offsets = launcher(Kernel.GROUP_OFFSETS, split_sizes)(split_sizes)
    tokens, N = token_of_rows(row_map), T * K
    probs = torch.rand(N, device=device)
    x_sorted, dy_sorted = gathered_copy(x, row_map), gathered_copy(dy, row_map)
    z, dz, h = torch.randn(N, 2 * I, **kw), torch.randn(N, 2 * I, **kw), torch.randn(N, I, **kw)
    fns: dict[str, Callable] = {}
    if gemm == "fc1_fwd":
        def fc1(a, rows=None, cfg=None):
            if cfg is None:  # the launcher's choice (its table; the reference off the GPU)
                return library.grouped_gemm_gated(a, w1.transpose(1, 2), offsets, act=SILU, probs=probs,
                                                  save_preact=True, a_rows=rows)
            return ggg.launch_grouped_gemm_gated(a, w1.transpose(1, 2), offsets, None, SILU, False, False, 7.0, 1.0,
                                                 probs, True, None, cfg, rows)
        fns = {"copy": lambda: fc1(gathered_copy(x, row_map)), "contiguous": lambda: fc1(x_sorted),
               "gathered": lambda: fc1(x, tokens)}
        extra = {f"gathered {n}": (lambda c=c: fc1(x, tokens, c)) for n, c in GATHERED_CONFIGS[gemm].items()}
        flop = 2.0 * N * H * 2 * I
    elif gemm == "fc2_dgrad":
        def dgrad(g, rows=None, cfg=None):
            if cfg is None:
                return library.grouped_gemm_dgrad_gated(g, w2, offsets, z, act=SILU, probs=probs, want_h=True,
                                                        dy_rows=rows)
            return ggg_bwd.launch_grouped_gemm_dgrad_gated(g, w2, offsets, z, SILU, False, False, 7.0, 1.0, probs,
                                                           True, None, cfg, rows)
        fns = {"copy": lambda: dgrad(gathered_copy(dy, row_map)), "contiguous": lambda: dgrad(dy_sorted),
               "gathered": lambda: dgrad(dy, tokens)}
        extra = {f"gathered {n}": (lambda c=c: dgrad(dy, tokens, c)) for n, c in GATHERED_CONFIGS[gemm].items()}
        flop = 2.0 * N * H * I
    elif gemm in ("fc1_wgrad", "fc2_wgrad"):
        # FC1's from dz and x's rows, FC2's from dy's rows and h: ``rows`` names the gathered one.
        fc1 = gemm == "fc1_wgrad"
        dy_op, x_op, dy_copy, x_copy, rows = (dz, x, dz, x_sorted, "x_rows") if fc1 else (dy, h, dy_sorted, h, "dy_rows")

        def wgrad(a, b, cfg=None, **gathered):
            if cfg is None:
                return library.grouped_gemm_wgrad(a, b, offsets, **gathered)
            return grouped_wgrad.launch_grouped_gemm_wgrad(a, b, offsets, None, None, cfg, **gathered)
        fns = {"copy": lambda: wgrad(dy_copy, x_copy), "gathered": lambda: wgrad(dy_op, x_op, **{rows: tokens})}
        fns["contiguous"] = fns["copy"]
        extra = {f"gathered {n}": (lambda c=c: wgrad(dy_op, x_op, c, **{rows: tokens}))
                 for n, c in GATHERED_CONFIGS[gemm].items()}
        flop = 2.0 * N * H * (2 * I if fc1 else I)
    else:  # lean's FC1 again in the backward: the pre-activation alone
        def recompute(a, rows=None, cfg=None):
            if cfg is None:
                return library.grouped_gemm(a, w1.transpose(1, 2), offsets, a_rows=rows)
            return grouped.launch_grouped_gemm(a, w1.transpose(1, 2), offsets, None, None, Activation.IDENTITY, 1.0,
                                               False, None, None, cfg, rows)
        fns = {"copy": lambda: recompute(gathered_copy(x, row_map)), "contiguous": lambda: recompute(x_sorted),
               "gathered": lambda: recompute(x, tokens)}
        extra = {f"gathered {n}": (lambda c=c: recompute(x, tokens, c)) for n, c in GATHERED_CONFIGS[gemm].items()}
        flop = 2.0 * N * H * 2 * I
    if tune:
        fns.update(extra)
    return fns, flop


def _outputs(result) -> list[torch.Tensor]:
    return [t for t in (result if isinstance(result, tuple) else (result,)) if t is not None]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in float32 slices of 2**26 elements (a weight gradient of DeepSeek-V3's
    experts is 7.5 G elements)."""
    num = den = 0.0
    for x, y in zip(a.flatten().split(1 << 26), b.flatten().split(1 << 26), strict=True):
        x, y = x.float(), y.float()
        num += (x - y).square().sum().item()
        den += y.square().sum().item()
    return (num / max(den, 1e-60)) ** 0.5


def measure(shape_name: str, shape: dict, routing_name: str, gemm: str, args) -> list[dict]:
    fns, flop = variants(shape, routing_name == "skewed", gemm, args.device, not args.smoke)
    ref = _outputs(fns["contiguous"]())
    errors = {}
    for name, fn in list(fns.items()):
        try:
            errors[name] = max(rel_err(o, r) for o, r in zip(_outputs(fn()), ref, strict=True))
        except OutOfResources as e:  # a candidate tile too large for this card: not timed
            print(f"  {shape_name} {routing_name} {gemm} {name}: does not fit ({e})", flush=True)
            del fns[name]
    if args.device == "cuda":
        times = interleaved_medians(fns, args.rounds, rep=args.rep)
    else:
        times = {name: elapsed_ms(fn, args.device) for name, fn in fns.items()}
    rows = []
    for name, ms in times.items():
        rows.append(dict(shape=shape_name, routing=routing_name, gemm=gemm, variant=name, ms=ms,
                         tflops=flop / ms / 1e9, x_copy=times["copy"] / ms, rel_err=errors[name]))
        print(f"  {shape_name} {routing_name} {gemm} {name}: {ms:.3f} ms, rel err {errors[name]:.1e}", flush=True)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    cells = sorted({(r["shape"], r["routing"]) for r in rows}, key=lambda c: (c[0], c[1]))
    fig, axes = plt.subplots(1, len(GEMMS), figsize=(4.5 * len(GEMMS), 4), sharey=True, squeeze=False)
    for ax, gemm in zip(axes[0], GEMMS, strict=True):
        for i, cell in enumerate(cells):
            best = [r for r in rows if (r["shape"], r["routing"]) == cell and r["gemm"] == gemm
                    and r["variant"].startswith("gathered")]
            if best:
                ax.bar(i, max(r["x_copy"] for r in best), color="tab:blue")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(cells)), [f"{s}\n{r}" for s, r in cells], rotation=60, fontsize=7)
        ax.set_title(gemm)
    axes[0][0].set_ylabel("copy's time / best gathered time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=list(CELL_SHAPES), choices=list(CELL_SHAPES))
    parser.add_argument("--routing", nargs="*", default=list(ROUTINGS), choices=list(ROUTINGS))
    parser.add_argument("--gemms", nargs="*", default=list(GEMMS), choices=list(GEMMS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep", type=int, default=50, help="do_bench's ms per round")
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny shape, the tables' tiles only")
    parser.add_argument("--out", type=Path, help="JSON path (default results/gathered_gemm-<gpu>-<date>.json)")
    args = parser.parse_args(argv)
    args.device = "cpu" if args.smoke else "cuda"
    shapes = SMOKE_SHAPES if args.smoke else {name: CELL_SHAPES[name] for name in args.shapes}
    out = args.out or (Path(tempfile.gettempdir()) / "gathered_gemm-smoke.json" if args.smoke
                       else results_path("gathered_gemm"))
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    rows = []
    for shape_name, shape in shapes.items():
        for routing_name in args.routing:
            for gemm in args.gemms:
                rows.extend(measure(shape_name, shape, routing_name, gemm, args))
            # After every cell: a run stopped by a time limit keeps what it measured.
            out.write_text(json.dumps(dict(device=device, torch=torch.__version__, rows=rows), indent=1))
    plot(rows, out.with_suffix(".png"))
    print(f"\n{'shape':<22}{'routing':<9}{'gemm':<14}{'variant':<20}{'ms':>9}{'TFLOP/s':>9}{'x copy':>8}{'rel err':>9}")
    for r in rows:
        print(f"{r['shape']:<22}{r['routing']:<9}{r['gemm']:<14}{r['variant']:<20}{r['ms']:>9.3f}{r['tflops']:>9.0f}"
              f"{r['x_copy']:>8.2f}{r['rel_err']:>9.1e}")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
