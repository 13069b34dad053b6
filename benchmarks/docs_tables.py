"""Writes every table of measured figures in README.md and docs/ from the committed results files.

A table lives between two marker lines in a Markdown file::

    <!-- docs_tables: moe-layer -->
    ... (written by this script: the table, then the command and the results file it comes from)
    <!-- /docs_tables -->

and everything between them is rewritten from ``benchmarks/results/``. Peak memory is counted one
way everywhere (``PEAK_CONVENTION``): a table shows a peak column only from a results file that
counts so. Run from the repository root::

    python -m benchmarks.docs_tables            # rewrite the marked regions
    python -m benchmarks.docs_tables --check    # exit 1, naming the regions, where a doc differs

``tests/test_docs_tables.py`` runs ``--check``, so a doc cannot drift from its results file. When
a benchmark's new results file replaces its old one, point the file's constant below at it
(``MOE_FILE``, ``HARNESSES_FILE``, ``TRAIN_FILE``) and run the script.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks._results import PEAK_CONVENTION, RESULTS

ROOT = RESULTS.parent.parent
DOCS = ("README.md", "docs")
REGION = re.compile(r"^<!-- docs_tables: (?P<name>[a-z0-9-]+) -->\n(?P<body>.*?)^<!-- /docs_tables -->$",
                    re.MULTILINE | re.DOTALL)
# Results files written before their benchmark stated its peak convention, whose script has always
# counted so (benchmarks/moe_layer.py's docstring: "the gradients are made inside the step and count").
COUNTED_SO = {"moe_layer-h200-2026-11-29.json"}

MOE_FILE = "moe_layer-h200-2026-11-29.json"
HARNESSES_FILE = "harnesses-h200-2026-11-29.json"
TRAIN_FILE = "train_moe_lm-h200-2026-11-29.json"
# moe_layer's cells: (shape key, label).
MOE_CELLS = (("qwen3-30b-a3b", "Qwen3-30B-A3B (E=128, k=8), T=32768"),
             ("qwen3-30b-a3b-t4096", "Qwen3-30B-A3B (E=128, k=8), T=4096"),
             ("olmoe-1b-7b", "OLMoE (E=64, k=8), T=16384"),
             ("mixtral-8x7b", "Mixtral-8x7B (E=8, k=2), T=8192"),
             ("deepseek-v3", "DeepSeek-V3 (E=256, k=8), T=8192"))
SHORT = {"qwen3-30b-a3b": "Qwen3 T=32768", "qwen3-30b-a3b-t4096": "Qwen3 T=4096", "olmoe-1b-7b": "OLMoE T=16384",
         "mixtral-8x7b": "Mixtral T=8192", "deepseek-v3": "DeepSeek-V3 T=8192"}
ACTS = {"dense gelu": "GELU", "dense swiglu": "SwiGLU"}
MOE_IMPLS = (("fuseops", "`expert_layer`"), ("fuseops lean", "`lean=True`"), ("torch", "torch"),
             ("torch.compile", "`torch.compile`"), ("sonicmoe", "SonicMoE"))


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def counts_peaks_so(name: str, results: dict) -> bool:
    meta = results.get("meta", results)
    return meta.get("peak") == PEAK_CONVENTION or name in COUNTED_SO


def load_counted(name: str) -> dict:
    """A results file whose peak columns a table shows: it must count peaks as ``PEAK_CONVENTION`` says."""
    results = load(name)
    if not counts_peaks_so(name, results):
        raise SystemExit(f"benchmarks/results/{name} does not count peak memory {PEAK_CONVENTION!r}")
    return results


def cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def source(name: str, commands: list[str], what: str = "") -> list[str]:
    """The line under a table: where its figures come from and how they were measured."""
    runs = "; ".join(f"`{c}`" for c in commands)
    return ["", f"{what}From `benchmarks/results/{name}` ({runs}); written by `python -m benchmarks.docs_tables`."]


def _moe_rows(results: dict) -> dict[tuple[str, str], dict]:
    return {(r["shape"], r["impl"]): r for r in results["rows"] if r["routing"] == "uniform" and r["mode"] == "fwd+bwd"}


def moe_layer() -> list[str]:
    """The expert layer's forward+backward TFLOP/s and peak memory per implementation, uniform routing."""
    results = load_counted(MOE_FILE)
    rows = _moe_rows(results)
    body = []
    for shape, label in MOE_CELLS:
        speeds = [rows.get((shape, impl)) for impl, _ in MOE_IMPLS]
        fastest = max(r["tflops"] for r in speeds if r is not None)
        body.append([label]
                    + ["-" if r is None else f"**{r['tflops']:.0f}**" if r["tflops"] == fastest
                       else f"{r['tflops']:.0f}" for r in speeds]
                    + [" / ".join(cell(r and r["peak_above_start_gb"], ".2f") for r in speeds)])
    head = ["layer, tokens T"] + [name for _, name in MOE_IMPLS] + ["peak GB, same order"]
    device = (f"{results['device']}, torch {results['torch']}, triton {results['triton']}, "
              f"SonicMoE {results['sonic-moe']}, bf16")
    return table(head, body) + source(MOE_FILE, [p["command"] for p in results["processes"]], f"{device}. ")


def moe_layer_memory() -> list[str]:
    """Peak memory of the expert layer against plain torch and SonicMoE, per shape."""
    results = load_counted(MOE_FILE)
    rows = _moe_rows(results)
    body = []
    for shape, label in MOE_CELLS:
        peak = {impl: rows[(shape, impl)]["peak_above_start_gb"] for impl, _ in MOE_IMPLS if (shape, impl) in rows}
        body.append([label] + [cell(peak.get(impl), ".2f") for impl, _ in MOE_IMPLS]
                    + [cell(peak["fuseops"] / peak["torch"], ".2f"),
                       cell(peak["fuseops"] / peak["sonicmoe"] if "sonicmoe" in peak else None, ".2f")])
    head = (["layer, tokens T"] + [f"{name} GB" for _, name in MOE_IMPLS]
            + ["`expert_layer` / torch", "`expert_layer` / SonicMoE"])
    return table(head, body) + source(MOE_FILE, [p["command"] for p in results["processes"]])


def _harness_rows(results: dict) -> dict[tuple[str, int, int, str], dict]:
    return {(r["model"], r["H"], r["T"], r["path"]): r for r in results["rows"] if "H" in r}


def dense_stack() -> list[str]:
    """The dense stack's speed against torch.nn's in a plain loop (host-bound at small T) and with
    both captured by the user's ``make_graphed_callables``."""
    results = load(HARNESSES_FILE)
    rows = _harness_rows(results)
    body = []
    for model, H, T, path in rows:
        if path != "fuseops":
            continue
        mine, torch_, graphed, torch_graphed = (rows[(model, H, T, p)]
                                                for p in ("fuseops", "torch", "fuseops graphed", "torch graphed"))
        body.append([f"{ACTS[model]}, H={H}", f"{T}",
                     f"{mine['loop_ms']:.2f} / {torch_['loop_ms']:.2f}",
                     f"{torch_['loop_ms'] / mine['loop_ms']:.2f}x",
                     f"{mine['host_ms']:.2f} / {torch_['host_ms']:.2f}",
                     f"{torch_graphed['loop_ms'] / graphed['loop_ms']:.2f}x"])
    head = ["4-block stack", "tokens T", "ms a step, loop: fuseops / torch.nn", "speed x torch.nn, loop",
            "host ms a step: fuseops / torch.nn", "speed x torch.nn, both graphed"]
    device = f"{results['meta']['device']}, torch {results['meta']['torch']}, bf16, forward+backward. "
    return table(head, body) + source(HARNESSES_FILE, results["meta"]["commands"][:1], device)


def _span(values: list[float], fmt: str = ".2f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}x" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}x"


def _ts(Ts: list[int]) -> str:
    return f"T={Ts[0]}" if len(Ts) == 1 else f"T={Ts[0]}-{Ts[-1]}"


def slower() -> list[str]:
    """Every measured case where a fuseops path is slower than its alternative, with what to do."""
    harness = load(HARNESSES_FILE)
    dense = _harness_rows(harness)
    body = []
    for model, H in dict.fromkeys((m, h) for m, h, _, p in dense if p == "fuseops"):
        Ts = sorted(T for m, h, T, p in dense if (m, h, p) == (model, H, "fuseops")
                    and dense[(m, h, T, "torch")]["loop_ms"] < dense[(m, h, T, "fuseops")]["loop_ms"])
        if not Ts:
            continue
        eager = [dense[(model, H, T, "torch")]["loop_ms"] / dense[(model, H, T, "fuseops")]["loop_ms"] for T in Ts]
        graphed = [dense[(model, H, T, "torch graphed")]["loop_ms"] / dense[(model, H, T, "fuseops graphed")]["loop_ms"]
                   for T in Ts]
        body.append([f"4-block {ACTS[model]} stack, H={H}, {_ts(Ts)}, eager loop (host-bound)",
                     f"{_span(eager)} torch.nn", "capture the step: `torch.cuda.make_graphed_callables` or "
                     f"`torch.cuda.graph` (both graphed: {_span(graphed)} torch.nn's)"])
    moe = load_counted(MOE_FILE)
    rows = {(r["shape"], r["routing"], r["impl"]): r for r in moe["rows"] if r["mode"] == "fwd+bwd"}
    behind = [(shape, routing) for shape, routing, impl in rows if impl == "sonicmoe"
              and rows[(shape, routing, "fuseops")]["tflops"] < rows[(shape, routing, impl)]["tflops"]]
    if behind:
        speed = [rows[(*k, "fuseops")]["tflops"] / rows[(*k, "sonicmoe")]["tflops"] for k in behind]
        memory = [rows[(*k, "fuseops")]["peak_above_start_gb"] / rows[(*k, "sonicmoe")]["peak_above_start_gb"]
                  for k in behind]
        shapes = ", ".join(SHORT[s] for s in dict.fromkeys(s for s, _ in behind))
        body.append([f"`expert_layer` against SonicMoE: {shapes}", f"{_span(speed)} SonicMoE",
                     f"none in fuseops yet; it holds {_span(memory)} SonicMoE's peak memory there"])
    lean_behind = [(shape, routing) for shape, routing, impl in rows if impl == "fuseops lean"
                   and rows[(shape, routing, impl)]["tflops"] < rows[(shape, routing, "torch.compile")]["tflops"]]
    if lean_behind:
        speed = [rows[(*k, "fuseops lean")]["tflops"] / rows[(*k, "torch.compile")]["tflops"] for k in lean_behind]
        default = [rows[(*k, "fuseops")]["tflops"] / rows[(*k, "torch.compile")]["tflops"] for k in lean_behind]
        shapes = ", ".join(SHORT[s] for s in dict.fromkeys(s for s, _ in lean_behind))
        body.append([f"`lean=True` against `torch.compile`: {shapes}", f"{_span(speed)} `torch.compile`",
                     f"the default `expert_layer` ({_span(default)} `torch.compile`); `lean=True` only where "
                     "saved activations are the limit"])
    body.append(["any fused path on a CPU", "slower than torch.nn: no results file holds a figure "
                 "(`python3 examples/quickstart.py` prints fused against torch.nn on your machine)",
                 "none: a CPU runs the kernels' plain torch references, for developing and testing"])
    head = ["where", "fuseops' speed", "what to do"]
    sources = (source(HARNESSES_FILE, harness["meta"]["commands"][:1], "Forward+backward, bf16, "
                      f"{harness['meta']['device']}. ")
               + source(MOE_FILE, [p["command"] for p in moe["processes"]])[1:])
    return table(head, body) + sources


def _command(c: str) -> str:
    """A recorded command without its ``--out`` folder (the machine's, not the reader's)."""
    return re.sub(r" --out \S+", "", c)


def train_moe_lm() -> list[str]:
    """Each run of the MoE language model at a real size: tokens/s, memory, loss."""
    results = load(TRAIN_FILE)
    step_peaks = counts_peaks_so(TRAIN_FILE, results)
    base = results["baseline"]
    body = []
    skipped = [r for r in results["rows"] if "skipped" in r]
    for r in results["rows"]:
        if "skipped" in r:
            continue
        name = f"`{r['run']}`" + (" (baseline)" if r["run"] == base else "")
        peaks = (f"{r['step_alloc_gb']:.2f} / " if step_peaks else "") + f"{r['peak_alloc_gb']:.2f} GB"
        body.append([name, f"{r['tokens_per_s']:,.0f}", f"{r['speedup_vs_baseline']:.2f}", peaks,
                     f"{r['final_val_loss']:.4f}", f"{r['loss_mad_vs_baseline']:.3f}"])
    peak_head = "peak allocated, " + ("in a step / whole run" if step_peaks else "whole run")
    head = ["run", "tokens/s", "x baseline", peak_head, "final val loss",
            f"mean \\|loss - baseline's\\|, last {results['meta']['compare_last']} steps"]
    meta = results["meta"]
    device = f"{meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}. "
    notes = "".join(f"`{r['run']}` did not finish ({r['skipped']}). " for r in skipped)
    return table(head, body) + source(TRAIN_FILE, [_command(c) for c in meta["commands"]], device + notes)


TABLES: dict[str, Callable[[], list[str]]] = {
    "slower": slower,
    "moe-layer": moe_layer,
    "moe-layer-memory": moe_layer_memory,
    "dense-stack": dense_stack,
    "train-moe-lm": train_moe_lm,
}


@dataclass(frozen=True)
class Region:
    path: Path
    name: str
    old: str
    new: str


def regions() -> list[Region]:
    """Every marked region under README.md and docs/, with its text now and as generated."""
    files = [ROOT / d for d in DOCS if (ROOT / d).is_file()]
    files += sorted(p for d in DOCS if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*.md"))
    found = []
    for path in files:
        for m in REGION.finditer(path.read_text(encoding="utf-8")):
            if m["name"] not in TABLES:
                raise SystemExit(f"{path.relative_to(ROOT)}: no table named {m['name']!r} (known: {sorted(TABLES)})")
            found.append(Region(path, m["name"], m["body"], "\n".join(TABLES[m["name"]]()) + "\n"))
    return found


def write(found: list[Region]) -> None:
    by_file: dict[Path, list[Region]] = {}
    for r in found:
        by_file.setdefault(r.path, []).append(r)
    for path, rs in by_file.items():
        new = {r.name: r.new for r in rs}
        def region(m: re.Match) -> str:
            return f"<!-- docs_tables: {m['name']} -->\n{new.get(m['name'], m['body'])}<!-- /docs_tables -->"
        text = REGION.sub(region, path.read_text(encoding="utf-8"))
        path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a doc differs")
    args = parser.parse_args(argv)
    found = regions()
    stale = [r for r in found if r.old != r.new]
    if args.check:
        for r in stale:
            print(f"{r.path.relative_to(ROOT)}: table {r.name!r} differs from its results file", file=sys.stderr)
        if stale:
            print("run: python -m benchmarks.docs_tables", file=sys.stderr)
        return 1 if stale else 0
    write(stale)
    for r in stale:
        print(f"rewrote {r.path.relative_to(ROOT)}: {r.name}")
    print(f"{len(found)} tables, {len(stale)} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
