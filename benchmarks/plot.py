"""A PNG beside a results JSON, for the benchmarks that do not draw their own: bar charts of the
figure each benchmark reports (a ratio against its baseline, or TFLOP/s per implementation).

    python -m benchmarks.plot benchmarks/results/quantize-h100-2026-11-27.json [more.json ...]

The kind of file is read from its name (``<benchmark>-<gpu>-<date>.json``); matplotlib is
optional (without it nothing is drawn).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from benchmarks._results import pyplot


def _bars(ax, labels: list[str], series: dict[str, list[float]], ylabel: str, line: float | None = None) -> None:
    """Grouped bars: one group per label, one bar per series."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        offset = width * (i - (len(series) - 1) / 2)
        ax.bar([j + offset for j in range(len(labels))], values, width, label=name)
    if line is not None:
        ax.axhline(line, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend(fontsize=7)


def _ratio_rows(rows: list[dict], label: Callable[[dict], str], field: str = "ratio"):
    return [label(r) for r in rows], {field: [r[field] for r in rows]}


def _autocast(d, ax):
    keys = ("ratio", "ratio_bf16_input", "ratio_recast", "ratio_same_input")
    _bars(ax, [r["model"] for r in d["rows"]], {k: [r[k] for r in d["rows"]] for k in keys},
          "bf16-weights ms / autocast ms (x)", 1.0)
    ax.set_title(f"float32 weights under autocast, T={d.get('T')}")


def _dense_dispatch(d, ax):
    import math

    for name, table in d["tables"].items():
        cells = table["cells"]
        tiles = [math.ceil(c["M"] / 128) * math.ceil(c["N"] / 128) for c in cells]
        ax.scatter(tiles, [c["graphed_speedup"] for c in cells], s=10, label=name)
    ax.set_xscale("log")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("output tiles of 128x128")
    ax.set_ylabel("cuBLAS + elementwise / fused (x, graphed)")
    ax.set_title("fused dense GEMM against cuBLAS + one elementwise kernel")
    ax.legend(fontsize=7)


def _elementwise(d, ax):
    _bars(ax, *_ratio_rows(d["rows"], lambda r: f"{r['op']} {'x'.join(map(str, r['shape']))}"),
          "torch ms / fuseops ms (x)", 1.0)
    ax.set_title("elementwise, gated and norm kernels against torch eager")


def _float32_precision(d, ax):
    rows = d["rows"]
    impls = list(rows[0]["ms"])
    _bars(ax, [f"{r['op']} E={r['E']}" for r in rows],
          {i: [r["ms"]["torch loop ieee"] / r["ms"][i] for r in rows] for i in impls},
          "speed vs torch.mm loop, IEEE (x)", 1.0)
    ax.set_title("float32 grouped GEMMs")


def _fp8_gemm_tiles(d, ax):
    groups = list(dict.fromkeys((r.get("recipe", ""), r["gemm"]) for r in d["rows"]))
    for j, (recipe, gemm) in enumerate(groups):
        mine = [r["tflops"] for r in d["rows"] if (r.get("recipe", ""), r["gemm"]) == (recipe, gemm)]
        ax.scatter([j] * len(mine), mine, s=12, color="tab:blue")
        ax.scatter([j], mine[:1], s=40, marker="*", color="tab:red")
    ax.set_xticks(range(len(groups)), [f"{r}\n{g}" for r, g in groups], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (red: the library's tile)")
    ax.set_title(f"quantized grouped GEMM tiles, {d.get('shape')}")


def _fp8_moe(d, ax):
    rows = [r for r in d["rows"] if r["impl"] != "bf16"]
    _bars(ax, *_ratio_rows(rows, lambda r: f"{r['shape']} {r['impl']} x{r['micro_batches']}", "vs_bf16"),
          "speed vs our bf16 layer (x)", 1.0)
    ax.set_title("MoE expert layer under quantized recipes")


def _gated_gemm(d, ax):
    _bars(ax, [f"{r['shape']} {r['kernel']} {r['candidate']}" for r in d["rows"]],
          {"TFLOP/s": [r["tflops"] for r in d["rows"]]}, "TFLOP/s")
    ax.set_title("gated grouped GEMMs, tile candidates")


def _moe_permute(d, ax):
    _bars(ax, *_ratio_rows(d["rows"], lambda r: f"{r['shape']} {r['op']}"), "torch ms / fuseops ms (x)", 1.0)
    ax.set_title("MoE permute / unpermute against torch")


def _quantize(d, ax):
    rows = [r for r in d["quantize"] if r["case"] != "copy"]
    series = {"eager": [r["ratio_vs_copy"] for r in rows],
              "CUDA graph": [r.get("graph_ratio_vs_copy") or 0.0 for r in rows]}
    _bars(ax, [r["case"] for r in rows], series, "bytes/s against a device copy", 1.0)
    ax.set_title("quantize kernels against a device-to-device copy")


def _wgrad_walk(d, ax):
    rows = d["rows"]
    _bars(ax, [f"{r['shape']} {r['layer']} {r['impl']}{' *' if r['picked'] else ''}" for r in rows],
          {"TFLOP/s": [r["tflops"] for r in rows]}, "TFLOP/s (*: the order picked)")
    ax.set_title("grouped weight gradients, K-first against N-first walk")


KINDS: dict[str, Callable] = {
    "autocast": _autocast, "dense_dispatch": _dense_dispatch, "elementwise": _elementwise,
    "float32_precision": _float32_precision, "fp8_gemm_tiles": _fp8_gemm_tiles, "fp8_moe": _fp8_moe,
    "gated_gemm": _gated_gemm, "moe_permute": _moe_permute, "quantize": _quantize, "wgrad_walk": _wgrad_walk,
}


def plot_file(path: str | Path) -> Path | None:
    """Draws ``path``'s PNG beside it; None where matplotlib is missing or the kind is unknown."""
    path = Path(path)
    kind = path.stem.split("-")[0]
    if kind not in KINDS:
        print(f"{path.name}: no plot for {kind!r}")
        return None
    plt = pyplot()
    if plt is None:
        return None
    data = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(11, 4.8))
    KINDS[kind](data, ax)
    device = data.get("device") or data.get("meta", {}).get("device", "")
    ax.set_title(f"{ax.get_title()} ({device})", fontsize=10)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    for path in parser.parse_args().files:
        out = plot_file(path)
        if out is not None:
            print(out)


if __name__ == "__main__":
    main()
