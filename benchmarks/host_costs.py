"""What one call costs the host: the pieces a training step's host time is made of.

Each row is a call issued back to back (no synchronisation inside the timed loop, few enough
calls that the launch queue never fills), timed on the host in microseconds per call, the
median of interleaved rounds: the driver's launch (``torch.empty``, a torch elementwise op,
``torch.addmm``, ``F.linear``, ``F.rms_norm``), fuseops' kernels as the ops call them
(``dense.gemm`` with a bias and GELU, ``rmsnorm_fwd``) through its cached launcher and through
Triton's own, the pieces of that launcher (the arguments' key, the keywords' key, the C launcher
alone), and whole forward+backward calls that isolate the executor: an identity ``Sequential``
against a bare ``torch.autograd.Function``, a ``Linear`` against ``torch.nn.Linear`` and against a
``torch.autograd.Function`` that runs the same three torch ops in its backward. The backward of
a step runs on autograd's device thread: the last rows show what Python costs there.

    python -m benchmarks.host_costs            # GPU (~30 s); host_costs-<gpu>-<date>.json
    python -m benchmarks.host_costs --smoke    # CPU: the rows that need no GPU, to check it runs

Writes ``benchmarks/results/host_costs-<gpu>-<date>.json`` (with ``--smoke`` the temp dir) and
prints a table last.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import fuseops
from benchmarks._results import RESULTS, results_path
from fuseops import ops

CALLS, ROUNDS = 200, 5


def per_call_us(fns: dict[str, Callable[[], object]], device: str, calls: int, rounds: int) -> dict[str, float]:
    """Host microseconds per call of each function: the median over ``rounds`` interleaved rounds
    of ``calls`` back-to-back calls (the device drained before each round, not inside it)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(5):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    if device == "cuda":
        torch.cuda.synchronize()
    return {name: sorted(ts)[rounds // 2] for name, ts in times.items()}


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


class _Linear(torch.autograd.Function):
    """``F.linear`` with its backward in Python: the same three torch ops torch's runs in C++."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        return dy @ w, dy.t() @ x, dy.sum(0)


def kernel_rows(device: str, dtype: torch.dtype, n: int) -> dict[str, Callable[[], object]]:
    """The launches: torch's and fuseops' kernels, and the pieces of fuseops' launcher (CUDA only)."""
    from fuseops.kernels import launch
    from fuseops.kernels.elementwise import norm
    from fuseops.kernels.elementwise.activation_math import Activation
    from fuseops.kernels.gemm import dense

    a = torch.randn(n, n, device=device, dtype=dtype)
    w = torch.randn(4 * n, n, device=device, dtype=dtype)
    b = torch.randn(4 * n, device=device, dtype=dtype)
    g = torch.randn(n, device=device, dtype=dtype)
    rows: dict[str, Callable[[], object]] = {
        "torch.empty": lambda: torch.empty(n, n, device=device, dtype=dtype),
        "a + a": lambda: a + a,
        "torch.addmm": lambda: torch.addmm(b, a, w.t()),
        "F.linear": lambda: F.linear(a, w, b),
        "F.rms_norm": lambda: F.rms_norm(a, (n,), g),
    }
    if device != "cuda":
        return rows
    rows["dense.gemm bias+GELU"] = lambda: dense.gemm(a, w.t(), bias=b, act=Activation.GELU_TANH)
    rows["rmsnorm_fwd"] = lambda: norm.rmsnorm_fwd(a, g, 1e-6)

    def through_triton(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            launch.ENABLED = False
            try:
                return fn()
            finally:
                launch.ENABLED = True
        return run
    rows["dense.gemm bias+GELU, Triton's launcher"] = through_triton(rows["dense.gemm bias+GELU"])
    rows["rmsnorm_fwd, Triton's launcher"] = through_triton(rows["rmsnorm_fwd"])
    # The launcher's pieces, on the norm kernel's stored entry (12 arguments, 7 keywords).
    rows["rmsnorm_fwd"]()
    state = launch._kernels[id(norm.norm_fwd_kernel)]
    entry = next(iter(state.entries.values()))
    y, rstd = torch.empty_like(a), torch.empty(n, device=device, dtype=torch.float32)
    args = (a, g, g, y, rstd, rstd, n, n, n, n, 1e-6, 132)
    keywords = {"IS_RMS": True, "HAS_BIAS": False, "ZERO_CENTERED": False, "BLOCK_M": 1, "BLOCK_N": n,
                "ONE_BLOCK": True, "num_warps": 4}
    device_index = torch.cuda.current_device()
    keyed = launch.args_key(state, device_index, args)
    stream = torch.cuda.current_stream().cuda_stream
    rows["launch: arguments' key"] = lambda: launch.args_key(state, device_index, args)
    rows["launch: keywords' key"] = lambda: launch.kwargs_key(keywords)
    rows["launch: the C launcher alone"] = lambda: entry.call(1, 1, 1, stream, entry.function, *entry.head,
                                                              *keyed[1], *entry.tail)
    return rows


def step_rows(device: str, dtype: torch.dtype, n: int) -> dict[str, Callable[[], object]]:
    """Whole forward+backward calls: the executor against a bare autograd Function, and a Linear."""
    x = torch.randn(n, n, device=device, dtype=dtype, requires_grad=True)
    identity = fuseops.Sequential(ops.Identity())
    linear = fuseops.Sequential(ops.Linear(n, n)).to(device, dtype)
    reference = torch.nn.Linear(n, n).to(device, dtype)
    weight, bias = reference.weight, reference.bias
    return {
        "x.sum().backward()": lambda: x.sum().backward(),
        "autograd.Function identity, fwd+bwd": lambda: _Identity.apply(x).sum().backward(),
        "Sequential(Identity), fwd+bwd": lambda: identity(x).sum().backward(),
        "Sequential(Identity), fwd": lambda: identity(x),
        "torch.nn.Linear, fwd+bwd": lambda: reference(x).sum().backward(),
        "autograd.Function linear, fwd+bwd": lambda: _Linear.apply(x, weight, bias).sum().backward(),
        "Sequential(Linear), fwd+bwd": lambda: linear(x).sum().backward(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="rows and features of the operands")
    parser.add_argument("--smoke", action="store_true", help="CPU, small operands, few calls")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    n = 16 if args.smoke else args.size
    calls, rounds = (20, 3) if args.smoke else (CALLS, ROUNDS)
    results = per_call_us(kernel_rows(device, dtype, n), device, calls, rounds)
    results |= per_call_us(step_rows(device, dtype, n), device, calls, rounds)
    out = args.out or results_path("host_costs", device=device,
                                   directory=Path(tempfile.gettempdir()) if args.smoke else RESULTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
            "size": n, "dtype": str(dtype).removeprefix("torch."), "calls": calls, "rounds": rounds}
    out.write_text(json.dumps({"meta": meta, "us_per_call": results}, indent=1))
    width = max(map(len, results))
    for name, us in results.items():
        print(f"{name:<{width}} {us:9.1f} us")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
