"""Each default path timed the ways users time a training step, with no warm-up beyond 3 steps.

Paths: the dense stack (4 pre-norm MLP blocks, GELU or SwiGLU) and the MoE expert layer
(``fuseops.moe.expert_layer``, default and ``lean=True``), forward+backward in bf16, beside the
same model in plain torch (eager and ``torch.compile``); the dense stacks under the user's own
``torch.cuda.make_graphed_callables``, and the expert layer under ``torch.compile``, with float32
weights under ``torch.autocast`` and in the user's CUDA graph (``--no-graphs`` skips these).
A graphed path runs ``do_bench`` and the loop only. Harnesses:

- ``do_bench``: ``triton.testing.do_bench`` of a step on a fresh input leaf per call, after one
  step whose output was kept until its backward;
- ``loop``: one input leaf, 20 steps between two CUDA events;
- ``micro``: 4 micro-batches, each a forward on its own input, then the 4 backwards;
- ``switch``: training steps interleaved with an evaluation forward and with a training step at
  half the token count, timing the full-size training steps.

Each row gives the milliseconds a step, the host milliseconds to issue one step after a drain,
and the peak memory above the start of a step whose gradient buffers are allocated inside it (as
a first step's are), allocated and reserved (GB). Nothing is warmed
beyond 3 steps, and nothing waits for anything to settle.

    python -m benchmarks.harnesses                       # GPU: every cell (~8 minutes)
    python -m benchmarks.harnesses --part dense --T 1024 --H 1024
    python -m benchmarks.harnesses --part moe --shapes qwen3 --T 4096
    python -m benchmarks.harnesses --part moe --merge    # add rows to today's file
    python -m benchmarks.harnesses --smoke               # CPU, tiny sizes, end to end

Writes ``benchmarks/results/harnesses-<gpu>-<date>.json`` (after every row) and ``.png``; prints a
table last.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks._results import PEAK_CONVENTION, RESULTS, pyplot, results_path
from benchmarks._timing import elapsed_ms
from benchmarks.sizes import FuseopsExpertLayer, FuseopsMoE, TorchMoE, fuseops_dense, moe_args, torch_dense

DENSE_T = (1024, 4096, 16384)
DENSE_H = (1024, 4096)
MOE_T = (4096, 32768)
# name: (E, H, I, top_k)
MOE_SHAPES = {"qwen3": (128, 2048, 768, 8), "olmoe": (64, 2048, 1024, 8), "mixtral": (8, 4096, 14336, 2)}
HARNESSES = ("do_bench", "loop", "micro", "switch")
GRAPHED_HARNESSES = ("do_bench", "loop")
WARMUP = 3
LOOP_STEPS = 20
MICRO_BATCHES = 4


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Path_:
    """One model to time: ``forward(x)`` returns the output whose sum is the loss; ``inputs(T)``
    makes a fresh input leaf of T tokens (routing is fixed per token count); ``harnesses`` those
    that apply (a CUDA graph is made for one token count, and each forward's outputs live in its
    buffers until the backward: no micro-batches, no change of token count)."""

    def __init__(self, name: str, forward: Callable[[torch.Tensor], torch.Tensor],
                 inputs: Callable[[int], torch.Tensor], params: list[torch.nn.Parameter],
                 harnesses: tuple[str, ...] = HARNESSES) -> None:
        self.name, self.forward, self.inputs, self.params = name, forward, inputs, params
        self.harnesses = harnesses

    def step(self, x: torch.Tensor) -> None:
        for p in self.params:
            p.grad = None
        self.forward(x).float().sum().backward()


def host_ms(path: Path_, T: int, device: str, reps: int = 5) -> float:
    """Median host milliseconds to issue one step, the device drained before each."""
    x = path.inputs(T)
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        path.step(x)
        times.append((time.perf_counter() - start) * 1e3)
    _sync(device)
    return sorted(times)[len(times) // 2]


def peak_gb(path: Path_, T: int, device: str) -> tuple[float, float]:
    """Peak memory above the step's start, allocated and reserved, in GB (the input made before).

    The step starts with no gradient buffers, as a first step does, so that they count inside
    it (``PEAK_CONVENTION``; ``benchmarks/moe_layer.py`` counts the same way)."""
    if device != "cuda":
        return 0.0, 0.0
    x = path.inputs(T)
    for p in path.params:
        p.grad = None
    _sync(device)
    torch.cuda.reset_peak_memory_stats()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    path.step(x)
    _sync(device)
    return ((torch.cuda.max_memory_allocated() - allocated) / 1e9,
            (torch.cuda.max_memory_reserved() - reserved) / 1e9)


def do_bench_ms(path: Path_, T: int, device: str) -> float:
    """``triton.testing.do_bench`` with a fresh input leaf per call, after one step whose output
    was kept until its backward (as a user's first step is)."""
    x = path.inputs(T)
    y = path.forward(x)
    y.float().sum().backward()
    del y
    if device != "cuda":
        return min(elapsed_ms(lambda: path.step(path.inputs(T)), device) for _ in range(3))
    import triton.testing

    return triton.testing.do_bench(lambda: path.step(path.inputs(T)))


def loop_ms(path: Path_, T: int, device: str) -> float:
    x = path.inputs(T)

    def steps() -> None:
        for _ in range(LOOP_STEPS):
            path.step(x)
    return elapsed_ms(steps, device) / LOOP_STEPS


def micro_ms(path: Path_, T: int, device: str) -> float:
    """Per micro-batch: MICRO_BATCHES forwards (each its own input), then their backwards."""
    xs = [path.inputs(T) for _ in range(MICRO_BATCHES)]

    def accumulate() -> None:
        for p in path.params:
            p.grad = None
        losses = [path.forward(x).float().sum() for x in xs]
        for loss in losses:
            loss.backward()
    accumulate()
    return min(elapsed_ms(accumulate, device) for _ in range(3)) / MICRO_BATCHES


def switch_ms(path: Path_, T: int, device: str) -> float:
    """Full-size training steps, each after an evaluation forward and a half-size training step."""
    x, half = path.inputs(T), path.inputs(max(T // 2, 1))
    times = []
    for _ in range(5):
        with torch.no_grad():
            path.forward(x)
        path.step(half)
        times.append(elapsed_ms(lambda: path.step(x), device))
    return sorted(times)[len(times) // 2]


HARNESS_FNS = {"do_bench": do_bench_ms, "loop": loop_ms, "micro": micro_ms, "switch": switch_ms}


def measure(path: Path_, T: int, device: str) -> dict:
    """Every harness for one path: a fresh process state is not needed (each harness starts with
    at most 3 steps of its own), but the order is fixed so that rows compare."""
    x = path.inputs(T)
    for _ in range(WARMUP):
        path.step(x)
    del x
    row: dict = {"path": path.name, "T": T}
    row["peak_alloc_gb"], row["peak_reserved_gb"] = peak_gb(path, T, device)
    for name in path.harnesses:
        row[f"{name}_ms"] = HARNESS_FNS[name](path, T, device)
    row["host_ms"] = host_ms(path, T, device)
    return row


def dense_paths(act: str, H: int, device: str, dtype: torch.dtype, graphs: bool) -> list[Path_]:
    torch.manual_seed(0)
    fused = fuseops_dense(H, act).to(device, dtype)
    plain = torch_dense(fused).to(device, dtype)

    def inputs(T: int) -> torch.Tensor:
        return torch.randn(T, H, device=device, dtype=dtype, requires_grad=True)
    paths = [Path_("fuseops", fused, inputs, list(fused.parameters())),
             Path_("torch", plain, inputs, list(plain.parameters()))]
    compiled = torch.compile(copy.deepcopy(plain))
    paths.append(Path_("torch.compile", compiled, inputs, list(compiled.parameters())))
    return paths


def graphed_paths(act: str, H: int, T: int, device: str, dtype: torch.dtype) -> list[Path_]:
    """Both stacks under the user's ``make_graphed_callables`` for one token count (a graph is
    shape-specific, and one forward's outputs live in the graph's buffers until its backward):
    timed by ``do_bench`` and the loop."""
    torch.manual_seed(0)
    fused = fuseops_dense(H, act).to(device, dtype)
    plain = torch_dense(fused).to(device, dtype)

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, H, device=device, dtype=dtype, requires_grad=True)
    out = []
    for name, model in (("fuseops graphed", fused), ("torch graphed", plain)):
        graphed = torch.cuda.make_graphed_callables(model, (inputs(T),))
        out.append(Path_(name, graphed, inputs, list(model.parameters()), GRAPHED_HARNESSES))
    return out


def moe_paths(shape: str, T: int, skewed: bool, device: str, dtype: torch.dtype, graphs: bool) -> list[Path_]:
    E, H, I, K = MOE_SHAPES[shape]
    torch.manual_seed(0)
    mine = FuseopsMoE(E, H, I).to(device, dtype)
    layer = FuseopsExpertLayer(mine)
    plain = TorchMoE(mine).to(device, dtype)
    routes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def routed(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if n not in routes:
            _, ids, weights = moe_args(n, E, H, K, skewed, device, dtype)
            routes[n] = ids, weights.detach()
        return routes[n]

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, H, device=device, dtype=dtype, requires_grad=True)

    def call(model: torch.nn.Module, lean: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
        def forward(x: torch.Tensor) -> torch.Tensor:
            ids, weights = routed(x.shape[0])
            if lean:
                import fuseops

                return fuseops.moe.expert_layer(x, ids, weights, mine.experts, lean=True)
            return model(x, ids, weights)
        return forward
    paths = [Path_("expert_layer", call(layer), inputs, list(mine.parameters())),
             Path_("expert_layer lean", call(layer, lean=True), inputs, list(mine.parameters())),
             Path_("torch", call(plain), inputs, list(plain.parameters()))]
    if device == "cuda":
        # (torch._grouped_mm compiles for bf16 only.)
        paths.append(Path_("torch.compile", call(torch.compile(plain)), inputs, list(plain.parameters())))
    if graphs:
        paths += user_harness_paths(mine, routed, T, H, device, dtype)
    return paths


def user_harness_paths(mine: FuseopsMoE, routed: Callable, T: int, H: int, device: str,
                       dtype: torch.dtype) -> list[Path_]:
    """The expert layer as users also run it: under ``torch.compile``; with float32 weights and
    inputs under ``torch.autocast(dtype=torch.bfloat16)`` (where ``expert_layer`` runs its
    composition: ``expert_layer_fallback``); captured with ``make_graphed_callables`` for T
    tokens (CUDA; last, captured when first called, so that its pool is not held while the
    other paths run)."""
    layer = FuseopsExpertLayer(mine)

    class Routed(torch.nn.Module):
        """The layer as a function of x alone (the routing fixed per token count)."""

        def __init__(self, layer: torch.nn.Module) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x, *routed(x.shape[0]))

    def inputs(n: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(n, H, device=device, dtype=dt, requires_grad=True)

    params = list(mine.parameters())
    paths = [Path_("expert_layer compiled", torch.compile(Routed(layer)), inputs, params)]
    wide = copy.deepcopy(mine).float()
    wide_layer = Routed(FuseopsExpertLayer(wide))

    def autocast_forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16):
            return wide_layer(x)
    paths.append(Path_("expert_layer autocast", autocast_forward, lambda n: inputs(n, torch.float32),
                       list(wide.parameters())))
    if device == "cuda":
        graphed: list = []

        def graphed_forward(x: torch.Tensor) -> torch.Tensor:
            if not graphed:
                graphed.append(torch.cuda.make_graphed_callables(Routed(layer), (inputs(T),)))
            return graphed[0](x)
        paths.append(Path_("expert_layer graphed", graphed_forward, inputs, params, GRAPHED_HARNESSES))
    return paths


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def dense_rows(Ts, Hs, acts, device, dtype, graphs: bool, add: Callable[[dict], None]) -> None:
    for act in acts:
        for H in Hs:
            torch._dynamo.reset()
            paths = dense_paths(act, H, device, dtype, graphs)
            for T in Ts:
                for path in paths:
                    row = measure(path, T, device)
                    row.update(model=f"dense {act}", H=H)
                    add(row)
                if graphs and device == "cuda":
                    # Made after the eager rows, so that their pools are not held while those run.
                    for path in graphed_paths(act, H, T, device, dtype):
                        row = measure(path, T, device)
                        row.update(model=f"dense {act}", H=H)
                        add(row)
                    _free()
            del paths
            _free()


def moe_rows(Ts, shapes, skews, device, dtype, graphs: bool, add: Callable[[dict], None]) -> None:
    for shape in shapes:
        torch._dynamo.reset()
        for T in Ts:
            for skewed in skews:
                _, H, I, K = MOE_SHAPES[shape]
                for path in moe_paths(shape, T, skewed, device, dtype, graphs):
                    row = measure(path, T, device)
                    row.update(model=f"moe {shape}", routing="skewed" if skewed else "uniform",
                               tflops_do_bench=18 * T * K * H * I / row["do_bench_ms"] / 1e9)
                    add(row)
                _free()


def print_table(rows: list[dict]) -> None:
    head = f"{'model':<14} {'routing':<8} {'T':>6} {'path':<22} " + " ".join(f"{h:>9}" for h in HARNESSES)
    print(head + f" {'host':>7} {'alloc GB':>9} {'resv GB':>8}")
    for r in rows:
        cells = " ".join(f"{r[h + '_ms']:9.3f}" if h + "_ms" in r else f"{'-':>9}" for h in HARNESSES)
        print(f"{r['model'] + (' H=' + str(r['H']) if 'H' in r else ''):<14} {r.get('routing', ''):<8} {r['T']:>6} "
              f"{r['path']:<22} {cells} {r['host_ms']:7.2f} {r.get('peak_alloc_gb', float('nan')):9.2f} "
              f"{r.get('peak_reserved_gb', float('nan')):8.2f}")


def plot(rows: list[dict], path: Path) -> None:
    """Per dense cell / MoE cell, each path's ms in each harness, relative to its fastest harness."""
    plt = pyplot()
    if plt is None:
        return
    full = [r for r in rows if all(h + "_ms" in r for h in HARNESSES)]
    labels = [f"{r['model']}{' H=' + str(r['H']) if 'H' in r else ''} {r.get('routing', '')} T={r['T']} {r['path']}"
              for r in full]
    fig, ax = plt.subplots(figsize=(10, 0.25 * len(labels) + 1.5))
    for h in HARNESSES:
        values = [r[h + "_ms"] / min(r[x + "_ms"] for x in HARNESSES) for r in full]
        ax.scatter(values, range(len(values)), label=h, s=12)
    ax.set_yticks(range(len(labels)), labels, fontsize=6)
    ax.axvline(1.03, color="grey", linestyle=":")
    ax.set_xlabel("ms a step / the path's fastest harness")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def earlier_rows(out: Path) -> tuple[list[str], list[dict]]:
    """For ``--merge`` (a run in parts, each within a time limit): the commands and rows already in
    ``out``, refused where its peaks are counted otherwise; none where there is no file yet."""
    if not out.exists():
        return [], []
    merged = json.loads(out.read_text())
    if merged["meta"].get("peak") != PEAK_CONVENTION:
        raise SystemExit(f"--merge: {out} counts peak memory otherwise ({merged['meta'].get('peak')!r})")
    return merged["meta"]["commands"], merged["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("all", "dense", "moe"), default="all")
    parser.add_argument("--T", type=int, nargs="*")
    parser.add_argument("--H", type=int, nargs="*", default=list(DENSE_H))
    parser.add_argument("--acts", nargs="*", default=["gelu", "swiglu"])
    parser.add_argument("--shapes", nargs="*", default=list(MOE_SHAPES))
    parser.add_argument("--skews", nargs="*", default=["uniform", "skewed"], choices=("uniform", "skewed"))
    parser.add_argument("--no-graphs", action="store_true",
                        help="skip the rows of user harnesses: make_graphed_callables, and for the expert layer "
                             "torch.compile and torch.autocast")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--merge", action="store_true", help="add the rows to --out's (or today's) results file")
    args = parser.parse_args()
    device, dtype = ("cpu", torch.float32) if args.smoke else ("cuda", torch.bfloat16)
    if args.smoke:
        MOE_SHAPES["tiny"] = (4, 32, 16, 2)
    # The smoke run checks the script: its file goes to the temp dir, not among the results.
    default_dir = Path(tempfile.gettempdir()) if args.smoke else RESULTS
    out = args.out or results_path("harnesses", device=device, directory=default_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    commands, rows = earlier_rows(out) if args.merge else ([], [])
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "commands": [*commands, " ".join(["python3 -m benchmarks.harnesses", *sys.argv[1:]])],
            "peak": PEAK_CONVENTION}

    def add(row: dict) -> None:
        """Print the row and rewrite the results file: a run stopped by a time limit keeps what it measured."""
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    graphs = not args.no_graphs
    if args.part in ("all", "dense"):
        Ts = args.T or ((64,) if args.smoke else DENSE_T)
        Hs = (32,) if args.smoke else args.H
        dense_rows(Ts, Hs, args.acts, device, dtype, graphs, add)
    if args.part in ("all", "moe"):
        Ts = args.T or ((64,) if args.smoke else MOE_T)
        shapes = ("tiny",) if args.smoke else args.shapes
        moe_rows(Ts, shapes, [s == "skewed" for s in args.skews], device, dtype, graphs, add)
    plot(rows, out.with_suffix(".png"))
    print_table(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
