"""fuseops across sizes: the dense stack (4 pre-norm MLP blocks, GELU and SwiGLU) and the MoE
expert layer (Qwen3, OLMoE, Mixtral shapes, uniform and skewed routing; composed as permute,
experts, unpermute, and as ``fuseops.moe.expert_layer``), forward+backward,
fuseops eager and compiled against torch eager and ``torch.compile`` of the same model built
from torch.nn, plus torch under ``make_graphed_callables`` (a cell is host-bound when torch
eager is more than 1.3x slower than graphed) and the host time per step on its own (enqueue
time: wall time of issuing one step without synchronising; "enq" after a drain, "busy" while
the device still runs the step before). Each variant first runs
``WARMUP_STEPS`` steps (torch.compile compiles, caches fill), then each cell keeps the fastest of
``--rounds`` interleaved rounds of its variants.

    python -m benchmarks.sizes                   # GPU: both parts (~12 minutes with 2 rounds)
    python -m benchmarks.sizes --part dense      # GPU: the dense stack (~6 minutes)
    python -m benchmarks.sizes --part moe        # GPU: the MoE layer (~5 minutes)
    python -m benchmarks.sizes --smoke           # CPU, tiny sizes, end to end (writes under the temp dir)

Writes ``benchmarks/results/sizes-<gpu>-<date>.json`` and ``.png`` (``--out`` to choose); prints a
table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from collections.abc import Callable
from copy import deepcopy as copy_module
from pathlib import Path

import torch

import fuseops
from benchmarks._results import pyplot, results_path
from fuseops import ops

DENSE_T = (1024, 4096, 16384)
DENSE_H = (1024, 2048, 4096)
MOE_T = (1024, 4096, 16384)
# name: (E, H, I, top_k)
MOE_SHAPES = {"qwen3": (128, 2048, 768, 8), "olmoe": (64, 2048, 1024, 8), "mixtral": (8, 4096, 14336, 2)}
HOST_BOUND = 1.3
# Interleaved rounds per cell (``measure``).
ROUNDS = 2


# Steps every variant runs before a cell's timed rounds (``measure``).
WARMUP_STEPS = 30


def fuseops_dense(H: int, act: str, depth: int = 4) -> torch.nn.Module:
    """4 pre-norm blocks: RMSNorm, Linear+bias, GELU(tanh) or SwiGLU, Linear+bias, residual."""
    def block() -> fuseops.Sequential:
        if act == "gelu":
            return fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, 4 * H), ops.GELU(approximate="tanh"),
                                      ops.Linear(4 * H, H), ops.AddExtraInput())
        F = 8 * H // 3 // 64 * 64
        return fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, 2 * F), ops.SwiGLU(), ops.Linear(F, H),
                                  ops.AddExtraInput())
    blocks = torch.nn.ModuleList(block() for _ in range(depth))

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = blocks

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x, x)
            return x
    return Stack()


def dense_cell(cell: str, device: str = "cuda", dtype: torch.dtype = torch.bfloat16
               ) -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    """``"act:T:H"`` (the benchmark scripts' cell argument): the fuseops stack, the same stack in
    torch.nn and an input needing grad, seeded as the sizes benchmark seeds them."""
    act, T, H = cell.split(":")
    torch.manual_seed(0)
    model = fuseops_dense(int(H), act).to(device, dtype)
    reference = torch_dense(model).to(device, dtype)
    return model, reference, torch.randn(int(T), int(H), device=device, dtype=dtype, requires_grad=True)


class TorchBlock(torch.nn.Module):
    """The same block from torch.nn, weights copied from a fuseops block."""

    def __init__(self, block: fuseops.Sequential) -> None:
        super().__init__()
        norm, fc1, act, fc2, _ = block
        self.norm = torch.nn.RMSNorm(norm.weight.shape[0], eps=norm.eps)
        self.fc1 = torch.nn.Linear(fc1.in_features, fc1.out_features)
        self.fc2 = torch.nn.Linear(fc2.in_features, fc2.out_features)
        self.gated = isinstance(act, ops.SwiGLU)
        with torch.no_grad():
            for mine, theirs in ((self.norm, norm), (self.fc1, fc1), (self.fc2, fc2)):
                for name, p in theirs.named_parameters(recurse=False):
                    getattr(mine, name).copy_(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.fc1(self.norm(x))
        if self.gated:
            a, b = z.chunk(2, -1)
            h = torch.nn.functional.silu(a) * b
        else:
            h = torch.nn.functional.gelu(z, approximate="tanh")
        return self.fc2(h) + x


def torch_dense(stack: torch.nn.Module) -> torch.nn.Module:
    return torch.nn.Sequential(*(TorchBlock(b) for b in stack.blocks))


class FuseopsMoE(torch.nn.Module):
    def __init__(self, E: int, H: int, I: int) -> None:
        super().__init__()
        self.E = E
        self.experts = fuseops.Sequential(ops.GroupedLinear(E, H, 2 * I), ops.SwiGLU(), ops.GroupedLinear(E, I, H))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        x_sorted, sizes, row_map = fuseops.moe.permute(x, ids, self.E)
        return fuseops.moe.unpermute(self.experts(x_sorted, sizes, sizes), row_map, weights)


class FuseopsExpertLayer(torch.nn.Module):
    """``mine``'s experts through ``fuseops.moe.expert_layer``: the same layer as one autograd
    Function."""

    def __init__(self, mine: FuseopsMoE) -> None:
        super().__init__()
        self.experts = mine.experts

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return fuseops.moe.expert_layer(x, ids, weights, self.experts)


class TorchMoE(torch.nn.Module):
    """argsort routing, gather, ``torch._grouped_mm`` x2 with SwiGLU, weighted index_add combine."""

    def __init__(self, mine: FuseopsMoE) -> None:
        super().__init__()
        self.E = mine.E
        self.w1 = torch.nn.Parameter(mine.experts[0].weight.detach().transpose(1, 2).contiguous())
        self.w2 = torch.nn.Parameter(mine.experts[2].weight.detach().transpose(1, 2).contiguous())

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        T, K = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        token = order // K
        counts = torch.zeros(self.E, dtype=torch.int32, device=x.device).index_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        z = torch._grouped_mm(x[token], self.w1, offs=offs)
        a, b = z.chunk(2, -1)
        y = torch._grouped_mm(torch.nn.functional.silu(a) * b, self.w2, offs=offs)
        y = y * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add_(0, token, y)


def routing(T: int, E: int, K: int, skewed: bool, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    # Skewed: expert popularity falls off as 1/rank (a few hot experts).
    prob = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) if skewed else torch.ones(E, dtype=torch.float64)
    ids = torch.stack([torch.multinomial(prob, K, generator=g) for _ in range(T)])
    weights = torch.softmax(torch.randn(T, K, generator=g), -1)
    return ids.to(device), weights.to(device)


def moe_args(T: int, E: int, H: int, K: int, skewed: bool = False, device: str = "cuda",
             dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An MoE layer's ``(x, expert_ids, weights)``: tokens and router weights needing grad."""
    x = torch.randn(T, H, device=device, dtype=dtype, requires_grad=True)
    ids, weights = routing(T, E, K, skewed, device)
    return x, ids, weights.to(dtype).requires_grad_()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_fn(model: Callable, args: tuple[torch.Tensor, ...], params: list[torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        for p in params:
            p.grad = None
        model(*args).sum().backward()
    return step


def time_ms(step: Callable[[], None], device: str, reps: int) -> float:
    """Median milliseconds per synchronised step."""
    for _ in range(3):
        step()
    _sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def enqueue_ms(step: Callable[[], None], device: str, reps: int) -> float:
    """Median host milliseconds to issue one step, the device drained before each."""
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    _sync(device)
    return sorted(times)[len(times) // 2]


def busy_enqueue_ms(step: Callable[[], None], device: str, reps: int) -> float:
    """Median host milliseconds to issue one step while the device still runs the step before
    it (issued right after a drain). ``enqueue_ms`` times a host that has just waited for the
    device, which on the H100 hosts runs the same Python up to ~4x slower after a long step; here
    the host has not waited, as in a training loop the GPU bounds."""
    times = []
    for _ in range(reps):
        _sync(device)
        step()
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    _sync(device)
    return sorted(times)[len(times) // 2]


def _device_frees(device: str) -> int:
    """cudaFree calls of the caching allocator so far (0 off the GPU)."""
    return torch.cuda.memory_stats().get("num_device_free", 0) if device == "cuda" else 0


def graphed_ms(model: torch.nn.Module, args: tuple[torch.Tensor, ...], device: str, reps: int) -> float | None:
    if device != "cuda":
        return None
    # make_graphed_callables replaces a module's forward with the graphed one for these
    # shapes: graph a copy, so the eager model still takes the next cell's row count.
    copy = copy_module(model)
    try:
        graphed = torch.cuda.make_graphed_callables(copy, args)
    except RuntimeError as error:
        # torch._grouped_mm in float32 (torch 2.11) copies the offsets to the host, which a
        # capture refuses; the cell's other variants still stand, without this one.
        print(f"torch model not graphed: {str(error).splitlines()[0]}", flush=True)
        del copy
        gc.collect()
        torch.cuda.empty_cache()
        return None
    ms = time_ms(step_fn(graphed, args, list(copy.parameters())), device, reps)
    # The graphed copy's forward closes over the copy (a reference cycle): without a collection
    # its graphs' pools (a cell's activations) outlive the cell, and a dense run over every
    # width runs out of memory (~29 GiB held in private pools by T=4096 H=4096).
    del copy, graphed
    gc.collect()
    torch.cuda.empty_cache()
    return ms


def measure(fuse_model, torch_model, args, device: str, reps: int, compile_torch: bool = True,
            rounds: int = ROUNDS, layer_model=None) -> dict:
    """One cell: each variant's step and enqueue ms, the fastest of ``rounds`` interleaved rounds
    (every variant once per round, the order reversed every other round, so that each meets the
    GPU in the same state: on the H100 a GPU-bound step runs at the power cap, ~1.5 GHz against
    1.98 GHz boost)."""
    row: dict = {}
    fparams, tparams = list(fuse_model.parameters()), list(torch_model.parameters())
    variants = {
        "fuseops": step_fn(fuse_model, args, fparams),
        "fuseops_compiled": step_fn(torch.compile(fuse_model), args, fparams),
        "torch": step_fn(torch_model, args, tparams),
    }
    if compile_torch:
        variants["torch_compiled"] = step_fn(torch.compile(torch_model), args, tparams)
    if layer_model is not None:
        variants["fuseops_layer"] = step_fn(layer_model, args, fparams)
        variants["fuseops_layer_compiled"] = step_fn(torch.compile(layer_model), args, fparams)
    # Steady state first: torch.compile compiles, plans and weight caches fill, as in a training
    # run's first steps.
    for step in variants.values():
        for _ in range(WARMUP_STEPS):
            step()
    for round_ in range(rounds):
        # Every other round in reverse order: a GPU-bound round heats the GPU, and at its power
        # cap the clock falls, so a fixed order would hand the later variants slower clocks.
        order = list(variants.items())
        for name, step in order if round_ % 2 == 0 else order[::-1]:
            step_ms = time_ms(step, device, reps)
            frees = _device_frees(device)
            host_ms = enqueue_ms(step, device, reps)
            # cudaFree (the caching allocator giving cached blocks back to find room) waits for
            # the device: an enqueue time with frees in it holds GPU time.
            row[f"{name}_enqueue_device_frees"] = row.get(f"{name}_enqueue_device_frees", 0) + _device_frees(device) - frees
            row[f"{name}_ms"] = min(step_ms, row.get(f"{name}_ms", step_ms))
            row.setdefault(f"{name}_round_ms", []).append(step_ms)
            row[f"{name}_enqueue_ms"] = min(host_ms, row.get(f"{name}_enqueue_ms", host_ms))
            busy_ms = busy_enqueue_ms(step, device, reps)
            row[f"{name}_busy_enqueue_ms"] = min(busy_ms, row.get(f"{name}_busy_enqueue_ms", busy_ms))
    row["torch_graphed_ms"] = graphed_ms(torch_model, args, device, reps)
    if device == "cuda":
        # What the cell leaves allocated (models, caches).
        row["cuda_allocated_mb"] = torch.cuda.memory_allocated() / 2**20
    best_torch = min(row["torch_ms"], row.get("torch_compiled_ms") or float("inf"))
    row["speedup"] = best_torch / row["fuseops_ms"]
    # The same ratio within each round: how far a ratio from the fastest rounds can move with the GPU's clock
    # state (at GPU-bound cells one variant's kernel time moves 3-7 % between rounds on an H100).
    row["speedup_rounds"] = [min(t, tc) / f for t, tc, f in zip(
        row["torch_round_ms"], row.get("torch_compiled_round_ms") or [float("inf")] * rounds,
        row["fuseops_round_ms"])]
    if layer_model is not None:
        row["layer_speedup"] = best_torch / row["fuseops_layer_ms"]
        if "torch_compiled_ms" in row:
            row["layer_compiled_speedup"] = row["torch_compiled_ms"] / row["fuseops_layer_compiled_ms"]
    row["host_bound"] = row["torch_graphed_ms"] is not None and row["torch_ms"] > HOST_BOUND * row["torch_graphed_ms"]
    return row


def dense_rows(device, dtype, Ts, Hs, reps, acts=("gelu", "swiglu"), save=None, rounds=ROUNDS) -> list[dict]:
    rows = []
    for act in acts:
        for H in Hs:
            # One model per width, all row counts through it: the compiled variants trace once
            # (rows marked dynamic), as a user's model does across batch sizes.
            torch._dynamo.reset()  # a fresh compile cache per model: no recompile limit reached
            torch.manual_seed(0)
            model = fuseops_dense(H, act).to(device, dtype)
            reference = torch_dense(model).to(device, dtype)
            for T in Ts:
                x = torch.randn(T, H, device=device, dtype=dtype, requires_grad=True)
                torch._dynamo.mark_dynamic(x, 0)
                rows.append({"part": "dense", "act": act, "T": T, "H": H,
                             **measure(model, reference, (x,), device, reps, rounds=rounds)})
                print(rows[-1], flush=True)
                if save:
                    save(rows)
            # The next width's cells start from this one's memory given back.
            del model, reference
            gc.collect()
    return rows


def moe_rows(device, dtype, Ts, shapes, reps, save=None, rounds=ROUNDS) -> list[dict]:
    rows = []
    for name, (E, H, I, K) in shapes.items():
        # One model per shape, every token count and routing through it (rows marked
        # dynamic): the compiled variants trace once per shape, not once per cell.
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = FuseopsMoE(E, H, I).to(device, dtype)
        reference = TorchMoE(model).to(device, dtype)
        layer = FuseopsExpertLayer(model)
        for T in Ts:
            for skewed in (False, True):
                x, ids, weights = moe_args(T, E, H, K, skewed, device, dtype)
                for t in (x, ids, weights):
                    torch._dynamo.mark_dynamic(t, 0)
                # torch.compile of _grouped_mm traces only for bf16 operands.
                row = measure(model, reference, (x, ids, weights), device, reps, compile_torch=dtype == torch.bfloat16,
                              rounds=rounds, layer_model=layer)
                rows.append({"part": "moe", "shape": name, "T": T, "routing": "skewed" if skewed else "uniform", **row})
                print(rows[-1], flush=True)
                if save:
                    save(rows)
        del model, reference, layer
        gc.collect()
    return rows


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    labels = [_label(r) for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.5), 4))
    ax.bar(range(len(rows)), [r["speedup"] for r in rows], color=["tab:red" if r["host_bound"] else "tab:blue" for r in rows])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), labels, rotation=70, fontsize=7)
    ax.set_ylabel("fuseops eager / best torch (x)")
    ax.set_title("fwd+bwd speedup (red: torch host-bound)")
    fig.tight_layout()
    fig.savefig(path)


def _label(r: dict) -> str:
    if r["part"] == "dense":
        return f"{r['act']} H={r['H']} T={r['T']}"
    return f"{r['shape']} T={r['T']} {r['routing'][0]}"


def print_table(rows: list[dict]) -> None:
    print(f"{'cell':34s} {'fuseops':>8s} {'compiled':>8s} {'torch':>8s} {'torch.c':>8s} {'graphed':>8s} "
          f"{'speedup':>7s} {'by round':>11s} {'enq f/t':>13s} {'busy f/t':>13s} host-bound")
    fmt = lambda v: f"{v:8.2f}" if v is not None else f"{'-':>8s}"  # noqa: E731
    for r in rows:
        print(f"{_label(r):34s} {fmt(r['fuseops_ms'])} {fmt(r['fuseops_compiled_ms'])} {fmt(r['torch_ms'])} "
              f"{fmt(r.get('torch_compiled_ms'))} {fmt(r['torch_graphed_ms'])} {r['speedup']:6.2f}x "
              f"{min(r['speedup_rounds']):5.2f}-{max(r['speedup_rounds']):<5.2f} "
              f"{r['fuseops_enqueue_ms']:6.2f}/{r['torch_enqueue_ms']:<6.2f} "
              f"{r['fuseops_busy_enqueue_ms']:6.2f}/{r['torch_busy_enqueue_ms']:<6.2f} {'yes' if r['host_bound'] else '   '}"
              + (f" expert_layer {r['fuseops_layer_ms']:.2f} ms {r['layer_speedup']:.2f}x enq "
                 f"{r['fuseops_layer_enqueue_ms']:.2f} busy {r['fuseops_layer_busy_enqueue_ms']:.2f}"
                 if "layer_speedup" in r else "")
              + (f" compiled {r['fuseops_layer_compiled_ms']:.2f} ms {r['layer_compiled_speedup']:.2f}x of torch.compile"
                 f" enq {r['fuseops_layer_compiled_enqueue_ms']:.2f}" if "layer_compiled_speedup" in r else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("dense", "moe", "all"), default="all")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: checks the script end to end")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds per cell (the fastest is kept)")
    parser.add_argument("--acts", nargs="*", default=["gelu", "swiglu"], choices=["gelu", "swiglu"])
    parser.add_argument("--T", nargs="*", type=int, help="token counts (default: 1024 4096 16384)")
    parser.add_argument("--H", nargs="*", type=int, help="dense widths (default: 1024 2048 4096)")
    parser.add_argument("--shapes", nargs="*", choices=list(MOE_SHAPES), help="MoE shapes (default: all)")
    parser.add_argument("--out", type=Path, help="results path without suffix (default results/sizes-<gpu>-<date>)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                        help="parameters' and inputs' dtype on the GPU (no autocast: a model built in that dtype)")
    args = parser.parse_args()
    if args.smoke:
        device, dtype, reps = "cpu", torch.float32, 3
        dense = ((64,), (32,))
        moe = ((64,), {"tiny": (4, 32, 48, 2)})
    else:
        device, dtype, reps = "cuda", getattr(torch, args.dtype), args.reps
        shapes = {k: v for k, v in MOE_SHAPES.items() if not args.shapes or k in args.shapes}
        dense, moe = (args.T or DENSE_T, args.H or DENSE_H), (args.T or MOE_T, shapes)
    if args.out:
        out = args.out
    elif args.smoke:
        out = Path(tempfile.gettempdir()) / "sizes-smoke"
    else:
        out = results_path("sizes", "")
    out.parent.mkdir(parents=True, exist_ok=True)
    done: list[dict] = []
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"

    def save(rows: list[dict]) -> None:
        # After every cell, so that a run stopped by a time limit keeps what it measured.
        out.with_suffix(".json").write_text(
            json.dumps({"device": name, "torch": torch.__version__, "dtype": str(dtype), "rows": done + rows},
                       indent=1))

    rows = []
    if args.part in ("dense", "all"):
        rows += dense_rows(device, dtype, *dense, reps, acts=args.acts, save=save, rounds=args.rounds)
        done.extend(rows)
    if args.part in ("moe", "all"):
        rows += moe_rows(device, dtype, *moe, reps, save=save, rounds=args.rounds)
    save(rows[len(done):])
    plot(rows, out.with_suffix(".png"))
    print_table(rows)
    print(f"results: {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
