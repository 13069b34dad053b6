"""Mixed precision the torch way: float32 weights under ``torch.autocast(bfloat16)`` against the
same model with bfloat16 weights, forward+backward.

Models: the expert MLP (GroupedLinear, SwiGLU, GroupedLinear) at the Qwen3-30B-A3B
(E=128, H=2048, I=768, top-8) and Mixtral-8x7B (E=8, H=4096, I=14336, top-2) shapes with
T=4096 tokens (``--T``), and the dense stack (4 pre-norm MLP blocks, GELU, T=4096, H=2048), also
built from torch.nn (the same ratios for torch's own modules). Each
autocast row also checks that its output is within bf16 rounding of the bf16-weight model's.

What a step is, in both models: forward, ``.sum().backward()``, gradients of the parameters and
of the input (a leaf) set to None first, so no step adds into a gradient left by the one before.

- ``ratio``: bf16 weights with a bf16 input, against float32 weights under autocast
  with a float32 input (the residual stream of an autocast model is float32): the autocast
  step also casts x to bf16 and dx back to float32, as torch's autocast does. The weights'
  bf16 copies are cast once per weight version (fuseops.weight_cache) and reused by every
  step here, since no optimizer steps between them.
- ``ratio_bf16_input``: the same with a bf16 input: only the weights' dtype differs.
- ``ratio_recast``: the weight cache cleared before each step, as after an optimizer step: what
  a training step with one micro-batch pays (the float32 -> bf16 cast of every weight).
- ``ratio_same_input``: both models given the float32 input under autocast, so only the weights'
  dtype differs and both pay the input's casts (a bf16-weight layer inside an autocast model
  with a float32 residual stream).

    python -m benchmarks.autocast            # GPU
    python -m benchmarks.autocast --smoke    # CPU, tiny sizes, end to end

Writes ``benchmarks/results/autocast-<gpu>-<date>.json`` (``--out``); prints a table last.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
from pathlib import Path

import torch

import fuseops
from benchmarks._results import results_path
from benchmarks.sizes import fuseops_dense, routing, step_fn, time_ms, torch_dense
from fuseops import ops

# name: (E, H, I, top_k)
EXPERT_SHAPES = {"qwen3": (128, 2048, 768, 8), "mixtral": (8, 4096, 14336, 2)}


class Experts(torch.nn.Module):
    """The expert MLP alone, on rows already grouped by expert."""

    def __init__(self, E: int, H: int, I: int) -> None:
        super().__init__()
        self.mlp = fuseops.Sequential(ops.GroupedLinear(E, H, 2 * I), ops.SwiGLU(), ops.GroupedLinear(E, I, H))

    def forward(self, x: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        return self.mlp(x, sizes, sizes)


def _leaf(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to(dtype).requires_grad_(t.requires_grad)


def _grad_leaves(model: torch.nn.Module, args: tuple) -> list[torch.Tensor]:
    return [*model.parameters(), *(a for a in args if a.requires_grad)]


def autocast_step(model: torch.nn.Module, args: tuple, device: str, dtype: torch.dtype, *, recast: bool = False):
    step = step_fn(model, args, _grad_leaves(model, args))

    def run() -> None:
        if recast:
            # As after an optimizer step: every weight's bf16 copy is made again.
            fuseops.weight_cache.clear()
        with torch.autocast(device, dtype=dtype):
            step()
    return run


def compare(name: str, float32_model: torch.nn.Module, args: tuple, device: str, dtype: torch.dtype,
            reps: int, rounds: int = 1) -> dict:
    low = copy.deepcopy(float32_model).to(dtype)
    low_args = tuple(_leaf(a, dtype) if a.is_floating_point() else a for a in args)
    with torch.no_grad(), torch.autocast(device, dtype=dtype):
        y_autocast = float32_model(*args)
    with torch.no_grad():
        y_low = low(*low_args)
    error = ((y_autocast.float() - y_low.float()).norm() / y_low.float().norm()).item()
    steps = {
        "autocast": autocast_step(float32_model, args, device, dtype),
        "bf16_input": autocast_step(float32_model, low_args, device, dtype),
        "recast": autocast_step(float32_model, args, device, dtype, recast=True),
        "low": step_fn(low, low_args, _grad_leaves(low, low_args)),
        "low_float32_input": autocast_step(low, args, device, dtype),
    }
    # Interleaved rounds, the fastest median of each: clock and thermal drift between
    # variants measured one after the other would otherwise move the ratios.
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(rounds):
        for key, step in steps.items():
            best[key] = min(best[key], time_ms(step, device, reps))
    autocast_ms, bf16_input_ms, recast_ms, low_ms = best["autocast"], best["bf16_input"], best["recast"], best["low"]
    low_float32_input_ms = best["low_float32_input"]
    return {"model": name, "autocast_float32_weights_ms": autocast_ms, "low_precision_weights_ms": low_ms,
            "ratio": low_ms / autocast_ms, "autocast_bf16_input_ms": bf16_input_ms,
            "ratio_bf16_input": low_ms / bf16_input_ms, "autocast_recast_ms": recast_ms,
            "ratio_recast": low_ms / recast_ms, "low_precision_weights_float32_input_ms": low_float32_input_ms,
            "ratio_same_input": low_float32_input_ms / autocast_ms, "relative_difference": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: checks the script end to end")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each variant's fastest median")
    parser.add_argument("--models", nargs="*", help="expert shapes to run (default: all) and 'dense'")
    parser.add_argument("--T", type=int, default=4096, help="tokens (the expert MLP gets T * top_k rows)")
    parser.add_argument("--out", type=Path, help="JSON path (default results/autocast-<gpu>-<date>.json; with --smoke the temp dir)")
    args = parser.parse_args()
    if args.smoke:
        device, reps, T = "cpu", 3, 64
        shapes, dense_H = {"tiny": (4, 32, 48, 2)}, 32
    else:
        device, reps, T = "cuda", args.reps, args.T
        shapes, dense_H = EXPERT_SHAPES, 2048
    dtype = torch.bfloat16
    rows = []
    wanted = set(args.models) if args.models else None
    for name, (E, H, I, K) in shapes.items():
        if wanted is not None and name not in wanted:
            continue
        torch.manual_seed(0)
        model = Experts(E, H, I).to(device)
        ids, _ = routing(T, E, K, False, device)
        sizes = torch.bincount(ids.reshape(-1), minlength=E)
        x = torch.randn(T * K, H, device=device, requires_grad=True)
        rows.append(compare(f"experts {name}", model, (x, sizes), device, dtype, reps, args.rounds))
        print(rows[-1], flush=True)
    if wanted is None or "dense" in wanted:
        torch.manual_seed(0)
        stack = fuseops_dense(dense_H, "gelu").to(device)
        x = torch.randn(T, dense_H, device=device, requires_grad=True)
        rows.append(compare(f"dense H={dense_H}", stack, (x,), device, dtype, reps, args.rounds))
        print(rows[-1], flush=True)
        # The same stack from torch.nn: what torch's own autocast costs on it (the ratios a
        # user of torch.nn sees, beside ours).
        rows.append(compare(f"torch.nn dense H={dense_H}", torch_dense(stack).to(device), (x,), device, dtype, reps, args.rounds))
        print(rows[-1], flush=True)
    out = args.out or (Path(tempfile.gettempdir()) / "autocast-smoke.json" if args.smoke else results_path("autocast"))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    method = (f"fastest of {args.rounds} interleaved medians of {reps} synchronised fwd+bwd steps; ratio = bf16-weights ms / autocast-float32-weights ms "
              "(float32 input; ratio_bf16_input: bf16 input; ratio_recast: weight cache cleared every step; "
              "ratio_same_input: both models given the float32 input under autocast)")
    out.write_text(json.dumps({"device": name, "torch": torch.__version__, "fuseops": fuseops.__version__, "T": T,
                               "method": method, "rows": rows}, indent=1))
    print(f"{'model':<24} {'autocast fp32 w (ms)':>20} {'bf16 w (ms)':>12} {'ratio':>6} {'bf16 x':>7} "
          f"{'recast':>7} {'same x':>7} {'rel diff':>9}")
    for r in rows:
        print(f"{r['model']:<24} {r['autocast_float32_weights_ms']:>20.3f} {r['low_precision_weights_ms']:>12.3f} "
              f"{r['ratio']:>6.2f} {r['ratio_bf16_input']:>7.2f} {r['ratio_recast']:>7.2f} "
              f"{r['relative_difference']:>9.1e}")


if __name__ == "__main__":
    main()
