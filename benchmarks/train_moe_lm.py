"""The MoE language model example trained at a real size on each experts backend.

``examples/train_moe_lm.py``'s Qwen3-MoE byte model at 8 layers, hidden 2048, 64 experts top-8 of
width 1024 (OLMoE's expert shape; at the example's default width, the hidden size, the float32
weights and AdamW's state alone take 105 GB), 4 sequences of 4096 bytes a step, 300 AdamW steps at
lr 3e-4 on float32 master weights with the forward under bf16 autocast, 8 MiB of text (the H200
machine's Python 3.12 standard library holds 10.7 MB of ``.py``). Runs, in the default order:

- ``fuseops``: the experts on fuseops (bf16 GEMMs);
- ``grouped_mm-autocast``: transformers' ``grouped_mm`` experts with the experts' weights cast to
  bf16 for the call, as autocast casts a Linear's (the example's backend of that name): bf16 GEMMs;
- ``fuseops-fp8``: fuseops under FP8 current scaling; ``fuseops-offload``: fuseops with activation
  offloading;
- ``grouped_mm``: transformers' ``grouped_mm`` experts as they are. torch's grouped_mm is not
  autocast-enabled and transformers casts the tokens to the weights' dtype, so with float32 master
  weights these GEMMs run in float32 (about 1 s a step here);
- ``batched_mm``, ``deepgemm``, ``sonicmoe``: transformers' other implementations, where they run,
  else skipped with the reason (``batched_mm`` copies one expert's weights per routed token: skipped
  when that exceeds the GPU's memory; ``deepgemm`` and ``sonicmoe`` load their kernels from the
  Hugging Face Hub through the ``kernels`` package).

The baseline of every ratio and target is the strongest transformers run: the one with the most
tokens/s among those that ran (``grouped_mm-autocast``, ``grouped_mm``, ``batched_mm``,
``deepgemm``, ``sonicmoe``), named in the table and in the JSON (``"baseline"``).

All runs have the same seed: the same initial weights and the same batches. Each runs in its own
subprocess, so that its peak memory is its own (no allocator pool, autocast or quantized-weight
cache, Triton state left by an earlier run), an out-of-memory or a crash ends that run only, and
``--timeout`` can stop it; the Triton cache on disk is shared, so only the first run compiles.
Per run: tokens/s over every step but the first 4 (plans, compiles, AdamW's state) and without
the evaluations; peak memory above the step's start (the most one of those steps allocated, and
reserved, beyond the weights, AdamW's state and the gradients in use as it began) and over the
whole run; the final training loss (mean of the last 10 steps) and validation loss (4 held-out
batches); the mean |loss - the baseline's loss| and |loss - fuseops' loss| over the last 100
steps (``fuseops-offload``'s against ``fuseops``, whose values offloading does not change, is the
run-to-run floor); tokens/s against the baseline and against ``fuseops``; and whether
``TARGETS`` are met.

    python -m benchmarks.train_moe_lm                       # H200, every run (about 17 minutes)
    python -m benchmarks.train_moe_lm --runs fuseops grouped_mm-autocast fuseops-fp8            # ~7.5 min
    python -m benchmarks.train_moe_lm --runs fuseops-offload --merge                             # ~2.5 min
    python -m benchmarks.train_moe_lm --runs grouped_mm --merge --timeout 560                    # ~7 min
    python -m benchmarks.train_moe_lm --smoke               # CPU, a tiny model, end to end (~40 s)

On an H200 a fuseops run takes about 150 s end to end (model build, the first step's compiles,
300 steps at ~0.27 s, 12 evaluations) and ``grouped_mm-autocast`` about 0.37 s a step, so a
10-minute call holds three runs: the first call above measures the speed, memory and loss
targets against the bf16 baseline and FP8's; the next add offloading and the float32
``grouped_mm`` (1.14 s a step: a call of its own) with ``--merge``, the baseline then
recomputed over all the runs the file holds.

Each run prints a progress line every 20th of its steps and, after its first timed step, its
estimated time. ``--merge`` keeps the runs of an existing results file (same configuration) that
this call does not repeat, so a 10-minute machine can run it in two calls; the results file is
written after every run, so a call stopped by its time limit keeps the runs it finished. Writes
``benchmarks/results/train_moe_lm-<gpu>-<date>.json`` and ``.png`` (``--out``; with ``--smoke``
the temp dir); prints a table last.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._results import PEAK_CONVENTION

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_moe_lm.py"
# name: the example's settings beyond the shared configuration.
RUNS: dict[str, dict] = {
    "fuseops": {"experts_backend": "fuseops"},
    "grouped_mm-autocast": {"experts_backend": "grouped_mm-autocast"},
    "fuseops-fp8": {"experts_backend": "fuseops", "recipe": "fp8-current"},
    "fuseops-offload": {"experts_backend": "fuseops", "offload": True},
    "grouped_mm": {"experts_backend": "grouped_mm"},
    "batched_mm": {"experts_backend": "batched_mm"},
    "deepgemm": {"experts_backend": "deepgemm"},
    "sonicmoe": {"experts_backend": "sonicmoe"},
}
# The runs on transformers' experts: the baseline is the one of them with the most tokens/s.
TRANSFORMERS = tuple(name for name, fields in RUNS.items() if fields["experts_backend"] != "fuseops")
BF16, FP8 = "fuseops", "fuseops-fp8"
HUB_KERNELS = ("deepgemm", "sonicmoe")
REAL = {"steps": 300, "layers": 8, "hidden": 2048, "moe_intermediate": 1024, "experts": 64, "top_k": 8,
        "seq": 4096, "batch": 4, "lr": 3e-4, "eval_every": 25, "data_bytes": 8 * 2**20, "seed": 0}
SMOKE = {"steps": 12, "layers": 1, "hidden": 32, "moe_intermediate": 48, "experts": 4, "top_k": 2,
         "seq": 32, "batch": 4, "lr": 3e-3, "eval_every": 6, "data_bytes": 2**16, "seed": 0}
# (what, value key in the checks, comparison, bound)
# The baseline: the fastest transformers run (``baseline``).
TARGETS = (
    ("fuseops tokens/s / the baseline's", "fuseops_speedup", ">=", 1.3),
    ("fuseops peak allocated / the baseline's, whole run", "fuseops_peak_ratio", "<=", 1.0),
    ("fuseops peak allocated / the baseline's, above the step's start", "fuseops_step_peak_ratio", "<=", 1.0),
    ("fuseops mean |loss - the baseline's|, last steps", "fuseops_loss_mad", "<=", 0.02),
    ("fuseops-fp8 tokens/s / fuseops'", "fp8_speedup", ">=", 1.2),
    ("fuseops-fp8 |final val loss / fuseops' - 1|", "fp8_val_rel", "<=", 0.01),
)


def load_example():
    """``examples/train_moe_lm.py`` as a module (``examples/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("train_moe_lm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class is made.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def unavailable(cfg) -> str | None:
    """Why a transformers implementation cannot run here (in the worker: it may read the device)."""
    import torch

    if cfg.experts_backend == "batched_mm" and cfg.device.startswith("cuda"):
        # It indexes the float32 expert weights by expert id: one [3 * I, H] copy per routed token.
        need = cfg.batch * cfg.seq * cfg.top_k * 3 * (cfg.moe_intermediate or cfg.hidden) * cfg.hidden * 4
        have = torch.cuda.get_device_properties(cfg.device).total_memory
        if need > have:
            return (f"batched_mm copies one expert's weights per routed token: {need / 1e9:,.0f} GB for one "
                    f"layer's forward at this size, the GPU has {have / 1e9:,.0f} GB")
    if cfg.experts_backend in HUB_KERNELS:
        try:
            module = importlib.import_module(f"transformers.integrations.{cfg.experts_backend}")
            getattr(module, f"is_{cfg.experts_backend}_loadable")(raise_error=True)
        except (ImportError, AttributeError) as e:
            return f"{cfg.experts_backend} is not loadable: {e}"
    return None


def worker(name: str, config: str, result_path: Path) -> None:
    """One run, in this process: progress lines on stdout, the result as JSON at ``result_path``."""
    import torch
    import transformers

    lm = load_example()
    cfg = lm.TrainConfig(**json.loads(config))
    reason = unavailable(cfg)
    if reason:
        result_path.write_text(json.dumps({"skipped": reason}))
        return
    every = max(1, cfg.steps // 20)
    timed: list[float] = []
    tokens = cfg.batch * cfg.seq

    def on_step(step: int, loss: float, seconds: float) -> None:
        if step > lm.UNTIMED_STEPS:
            timed.append(seconds)
        mean = sum(timed) / len(timed) if timed else seconds
        if step == 1:
            print(f"  {name}: step 1 took {seconds:.1f} s (plans, compiles)", flush=True)
        if step == lm.UNTIMED_STEPS + 1:
            evals = sum(1 for s in range(step + 1, cfg.steps + 1) if cfg.eval_every and (s % cfg.eval_every == 0
                                                                                        or s == cfg.steps))
            print(f"  {name}: ~{mean:.2f} s a step: ~{mean * (cfg.steps - step):.0f} s of steps left, "
                  f"and {evals} evaluations", flush=True)
        if step % every == 0 or step == cfg.steps:
            print(f"  {name}: step {step}/{cfg.steps} loss {loss:.4f} {tokens / mean:,.0f} tokens/s "
                  f"~{mean * (cfg.steps - step):.0f} s left", flush=True)

    start = time.perf_counter()
    result = lm.train(cfg, progress=False, on_step=on_step)
    out = result.to_json()
    out.update(process_s=time.perf_counter() - start, torch=torch.__version__, transformers=transformers.__version__,
               device_name=torch.cuda.get_device_name(cfg.device) if cfg.device.startswith("cuda") else "cpu")
    result_path.write_text(json.dumps(out))
    print(f"  {name}: {result.tokens_per_s:,.0f} tokens/s, peak {result.peak_memory_bytes / 1e9:.2f} GB allocated, "
          f"{cfg.steps} steps in {result.wall_s:.0f} s ({out['process_s']:.0f} s with the model's build)", flush=True)


def default_out() -> Path:
    """``results_path("train_moe_lm")``, asked of a child process: naming the GPU initializes CUDA,
    and this process holds no CUDA context while the runs measure their memory."""
    code = "from benchmarks._results import results_path; print(results_path('train_moe_lm'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env=_child_env())
    return Path(done.stdout.strip())


def _child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def launch(name: str, cfg_fields: dict, timeout_s: float) -> dict:
    """Runs ``name`` in a subprocess; its result, or ``{"skipped": reason}``."""
    if name in HUB_KERNELS and not cfg_fields["device"].startswith("cuda"):
        return {"skipped": f"{name} needs a CUDA GPU"}
    if name in HUB_KERNELS and importlib.util.find_spec("kernels") is None:
        return {"skipped": f"{name}: transformers loads its kernels through the `kernels` package, not installed"}
    with tempfile.TemporaryDirectory() as tmp:
        result_path, err_path = Path(tmp, "result.json"), Path(tmp, "stderr.txt")
        cmd = [sys.executable, "-m", "benchmarks.train_moe_lm", "--worker", name,
               "--worker-config", json.dumps(cfg_fields), "--worker-result", str(result_path)]
        with err_path.open("w") as err:
            try:
                done = subprocess.run(cmd, check=False, cwd=ROOT, env=_child_env(), stderr=err, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return {"skipped": f"stopped by --timeout {timeout_s:.0f} s"}
        code = done.returncode
        if code == 0 and result_path.exists():
            return json.loads(result_path.read_text())
        lines = [line for line in err_path.read_text().splitlines() if line.strip()]
        print("\n".join(lines[-15:]), flush=True)
        return {"skipped": f"failed (exit code {code}): {lines[-1][:300] if lines else 'no message'}"}


def _smoothed(losses: list[float], window: int = 10) -> list[float]:
    return [sum(losses[max(0, i - window + 1): i + 1]) / min(window, i + 1) for i in range(len(losses))]


def baseline(runs: dict[str, dict]) -> str | None:
    """The strongest transformers run: the most tokens/s among those in ``TRANSFORMERS`` that ran
    (None when none did)."""
    done = [name for name in TRANSFORMERS if name in runs and "skipped" not in runs[name]]
    return max(done, key=lambda name: runs[name]["tokens_per_s"], default=None)


def summarize(runs: dict[str, dict], compare_last: int) -> tuple[list[dict], dict]:
    """A row per run and the targets' checks, against ``baseline(runs)``."""
    done = {name: r for name, r in runs.items() if "skipped" not in r}
    base_name = baseline(runs)
    base, bf16 = done.get(base_name), done.get(BF16)
    rows = []
    for name, r in runs.items():
        if "skipped" in r:
            rows.append({"run": name, "skipped": r["skipped"]})
            continue
        row = {"run": name, "tokens_per_s": r["tokens_per_s"], "peak_alloc_gb": r["peak_memory_bytes"] / 1e9}
        for key, field in (("peak_reserved_gb", "peak_reserved_bytes"), ("step_alloc_gb", "step_peak_allocated_bytes"),
                           ("step_reserved_gb", "step_peak_reserved_bytes")):
            row[key] = r[field] / 1e9 if r.get(field) is not None else None
        row["final_train_loss"], row["final_val_loss"] = r["final_smoothed_loss"], r["final_val_loss"]
        if base is not None:
            n = min(compare_last, len(r["losses"]), len(base["losses"]))
            pairs = zip(r["losses"][-n:], base["losses"][-n:], strict=True)
            row["loss_mad_vs_baseline"] = sum(abs(a - b) for a, b in pairs) / n
            row["speedup_vs_baseline"] = r["tokens_per_s"] / base["tokens_per_s"]
        if bf16 is not None:
            row["speedup_vs_fuseops"] = r["tokens_per_s"] / bf16["tokens_per_s"]
            n = min(compare_last, len(r["losses"]), len(bf16["losses"]))
            pairs = zip(r["losses"][-n:], bf16["losses"][-n:], strict=True)
            row["loss_mad_vs_fuseops"] = sum(abs(a - b) for a, b in pairs) / n
            if r["final_val_loss"] is not None and bf16["final_val_loss"] is not None:
                row["val_rel_vs_fuseops"] = r["final_val_loss"] / bf16["final_val_loss"] - 1
        rows.append(row)
    by_run = {row["run"]: row for row in rows}
    fuse, base_row, fp8 = by_run.get(BF16, {}), by_run.get(base_name, {}), by_run.get(FP8, {})

    def ratio(a, b):
        return a / b if a is not None and b else None

    values = {
        "fuseops_speedup": fuse.get("speedup_vs_baseline"),
        "fuseops_peak_ratio": ratio(fuse.get("peak_alloc_gb"), base_row.get("peak_alloc_gb")),
        "fuseops_step_peak_ratio": ratio(fuse.get("step_alloc_gb"), base_row.get("step_alloc_gb")),
        "fuseops_loss_mad": fuse.get("loss_mad_vs_baseline"),
        "fp8_speedup": fp8.get("speedup_vs_fuseops"),
        "fp8_val_rel": abs(fp8["val_rel_vs_fuseops"]) if "val_rel_vs_fuseops" in fp8 else None,
    }
    checks = {}
    for what, key, op, bound in TARGETS:
        value = values[key]
        met = None if value is None else (value >= bound if op == ">=" else value <= bound)
        checks[key] = {"what": what, "value": value, "target": f"{op} {bound}", "met": met}
    return rows, checks


def plot(runs: dict[str, dict], rows: list[dict], title: str, path: Path) -> None:
    """Training loss (mean of 10 steps) and validation loss of every run; their difference from
    the baseline's; tokens/s and peak memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = {name: r for name, r in runs.items() if "skipped" not in r}
    fig, (curves, diffs, speed) = plt.subplots(1, 3, figsize=(18, 5), gridspec_kw={"width_ratios": [3, 3, 2]})
    base_name = baseline(runs)
    base = done.get(base_name)
    for i, (name, r) in enumerate(done.items()):
        color = f"C{i}"
        smooth = _smoothed(r["losses"])
        curves.plot(range(1, len(smooth) + 1), smooth, color=color, label=name)
        if r["val_losses"]:
            curves.plot(*zip(*r["val_losses"]), marker="o", linestyle=":", color=color, markersize=3)
        if base is not None:
            n = min(len(smooth), len(base["losses"]))
            reference = _smoothed(base["losses"])
            diffs.plot(range(1, n + 1), [a - b for a, b in zip(smooth[:n], reference[:n])], color=color, label=name)
    curves.set(xlabel="step", ylabel="cross entropy (nats per byte)", title="training (lines, mean of 10) and "
               "validation (dots) loss")
    curves.legend(fontsize=8)
    diffs.axhline(0, color="k", lw=0.8)
    diffs.set(xlabel="step", ylabel="loss - the baseline's (means of 10)",
              title=f"difference from the baseline ({base_name or 'none ran'})")
    measured = [row for row in rows if "skipped" not in row]
    bars = speed.bar(range(len(measured)), [row["tokens_per_s"] for row in measured],
                     color=[f"C{list(done).index(row['run'])}" for row in measured])
    speed.bar_label(bars, [f"{row['peak_alloc_gb']:.1f} GB" for row in measured], fontsize=7)
    speed.set_xticks(range(len(measured)), [row["run"] for row in measured], rotation=30, ha="right", fontsize=8)
    speed.set(ylabel="tokens/s (labels: peak allocated)", title="throughput")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(rows: list[dict], checks: dict, base_name: str | None) -> None:
    def cell(value: float | None, spec: str, width: int) -> str:
        return format(value, f"{width}{spec}") if value is not None else f"{'-':>{width}}"

    print(f"{'run':<20} {'tokens/s':>10} {'x base':>7} {'x fuse':>7} {'step alloc':>10} {'step resv':>9} "
          f"{'peak alloc':>10} {'peak resv':>9} {'train':>7} {'val':>7} {'|dloss|':>7} {'dval %':>7}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['run']:<20} skipped: {r['skipped']}")
            continue
        val_rel = r.get("val_rel_vs_fuseops")
        val_rel_cell = f"{'-':>7}" if val_rel is None else f"{100 * val_rel:+7.2f}"
        print(f"{r['run']:<20} {r['tokens_per_s']:>10,.0f} {cell(r.get('speedup_vs_baseline'), '.2f', 7)} "
              f"{cell(r.get('speedup_vs_fuseops'), '.2f', 7)} {cell(r['step_alloc_gb'], '.2f', 10)} "
              f"{cell(r['step_reserved_gb'], '.2f', 9)} {cell(r['peak_alloc_gb'], '.2f', 10)} "
              f"{cell(r['peak_reserved_gb'], '.2f', 9)} {r['final_train_loss']:7.4f} "
              f"{cell(r['final_val_loss'], '.4f', 7)} {cell(r.get('loss_mad_vs_baseline'), '.4f', 7)} "
              f"{val_rel_cell}")
    print(f"baseline: {base_name or 'none (no transformers run ran)'}, the transformers run with the most tokens/s; "
          "memory in GB; step: above the step's start; |dloss|: mean |loss - the baseline's| over the last steps; "
          "dval: final validation loss against fuseops'")
    floor = next((r.get("loss_mad_vs_fuseops") for r in rows if r["run"] == "fuseops-offload"), None)
    if floor is not None:
        # Offloading changes no value: what separates the two runs is the run-to-run variation
        # (attention's backward accumulates in a varying order), the floor of any |dloss|.
        print(f"run-to-run floor: mean |loss - fuseops'| of fuseops-offload (the same values) = {floor:.4f}")
    for check in checks.values():
        verdict = {True: "met", False: "MISSED", None: "not measured"}[check["met"]]
        value = "-" if check["value"] is None else f"{check['value']:.3f}"
        print(f"{verdict:>12}: {check['what']} = {value} (target {check['target']})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--runs", nargs="*", choices=list(RUNS), default=list(RUNS),
                        help="which runs, in the order given")
    for name, default in REAL.items():
        flag = f"--{name.replace('_', '-')}"
        parser.add_argument(flag, type=type(default), default=default, help=f"the example's {flag}")
    parser.add_argument("--compare-last", type=int, default=100, help="steps the loss difference averages")
    parser.add_argument("--timeout", type=float, default=540, help="seconds a run may take, its model's build included")
    parser.add_argument("--merge", action="store_true", help="keep the other runs of an existing --out file")
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny model: checks the script end to end")
    parser.add_argument("--out", type=Path, help="JSON path (default results/train_moe_lm-<gpu>-<date>.json; "
                                                  "with --smoke the temp dir)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-config", help=argparse.SUPPRESS)
    parser.add_argument("--worker-result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.worker_config, args.worker_result)
        return
    shared = dict(SMOKE) if args.smoke else {name: getattr(args, name) for name in REAL}
    shared.update(device="cpu" if args.smoke else "cuda", dtype="bfloat16")
    if args.out is not None:
        out = args.out
    elif args.smoke:
        out = Path(tempfile.gettempdir()) / "train_moe_lm-smoke.json"
    else:
        out = default_out()
    kept: dict[str, dict] = {}
    command = " ".join(["python -m benchmarks.train_moe_lm", *(argv if argv is not None else sys.argv[1:])])
    commands = [command]
    if args.merge and out.exists():
        old = json.loads(out.read_text())
        if old["config"] != shared:
            differ = {k: (old["config"].get(k), v) for k, v in shared.items() if old["config"].get(k) != v}
            raise SystemExit(f"--merge: {out} holds runs of another configuration; by field, its value and "
                             f"this call's: {differ}")
        kept = {name: r for name, r in old["runs"].items() if name not in args.runs}
        commands = [*old.get("meta", {}).get("commands", []), command]
    lm = load_example()
    for name in args.runs:
        # Refuses a bad size or combination here, before any run starts.
        lm.TrainConfig(**shared, **RUNS[name])
    fresh: dict[str, dict] = {}
    start = time.perf_counter()

    def write() -> tuple[dict[str, dict], list[dict], dict, dict]:
        # After every run, so that a call stopped by its time limit keeps the runs it finished.
        runs = {name: fresh.get(name, kept.get(name)) for name in RUNS if name in fresh or name in kept}
        rows, checks = summarize(runs, args.compare_last)
        done = [r for r in runs.values() if "skipped" not in r]
        meta = {"device": done[0]["device_name"] if done else shared["device"],
                "torch": done[0]["torch"] if done else None,
                "transformers": done[0]["transformers"] if done else None,
                "untimed_steps": lm.UNTIMED_STEPS, "compare_last": args.compare_last, "commands": commands,
                # Runs merged from an older file may count their step peaks otherwise.
                "peak": PEAK_CONVENTION if all(r.get("peak") == PEAK_CONVENTION for r in done) else None,
                "wall_s": time.perf_counter() - start}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta, "config": shared, "runs": runs, "baseline": baseline(runs),
                                   "rows": rows, "checks": checks}, indent=1))
        return runs, rows, checks, meta

    for name in args.runs:
        print(f"== {name} ({json.dumps(RUNS[name])})", flush=True)
        run_start = time.perf_counter()
        fresh[name] = {**launch(name, {**shared, **RUNS[name]}, args.timeout), "peak": PEAK_CONVENTION}
        if "skipped" in fresh[name]:
            print(f"  {name}: skipped: {fresh[name]['skipped']}", flush=True)
        print(f"  {name}: {time.perf_counter() - run_start:.0f} s", flush=True)
        write()
    runs, rows, checks, meta = write()
    cfg = lm.TrainConfig(**shared)
    title = (f"Qwen3-MoE bytes: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.experts} experts of "
             f"{cfg.moe_intermediate or cfg.hidden} top-{cfg.top_k}, {cfg.batch}x{cfg.seq} tokens a step, "
             f"bf16 autocast, {meta['device']}")
    plot(runs, rows, title, out.with_suffix(".png"))
    print_table(rows, checks, baseline(runs))
    print(f"wrote {out} and {out.with_suffix('.png')} ({meta['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
