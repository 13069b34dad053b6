"""Session 64 probe: torch's CPU activation kernels at large and non-finite inputs, per vector ISA.

The H200 host's torch 2.11 gave F.gelu(+inf) = NaN on the CPU (session 64 run 1,
test_non_finite_inputs_placed_as_torch_places_them[GELU...]); the H100 hosts and this project's
CPU gave inf. Prints, per ATEN_CPU_CAPABILITY the host allows, each function's values where they
differ from float64's placement of NaN / inf or exceed its error, in a tensor of 64 (vector body)
and of 7 (tail) elements.

    python benchmarks/results/session64/cpu_kernels_probe.py          # every capability
"""
import os
import subprocess
import sys

import torch

VALUES = [float("inf"), -float("inf"), float("nan"), 3e38, 1e20, 2e19, 1e12, 1e6, 100.0, 30.0, 12.0, 9.0, 5.0,
          1.5, 0.0, -2.0, -5.0, -9.0, -30.0, -1e6, -1e20, -3e38]


def functions():
    F = torch.nn.functional
    one = torch.ones
    return {
        "gelu": lambda x: F.gelu(x),
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_bwd": lambda x: torch.ops.aten.gelu_backward(one(x.shape, dtype=x.dtype), x),
        "gelu_tanh_bwd": lambda x: torch.ops.aten.gelu_backward(one(x.shape, dtype=x.dtype), x, approximate="tanh"),
        "silu": F.silu,
        "silu_bwd": lambda x: torch.ops.aten.silu_backward(one(x.shape, dtype=x.dtype), x),
        "sigmoid": torch.sigmoid,
        "erf": torch.erf,
        "tanh": torch.tanh,
    }


def probe() -> None:
    print("capability", torch.backends.cpu.get_cpu_capability(), torch.__version__, flush=True)
    for name, fn in functions().items():
        for n in (64, 7):
            for dtype in (torch.float32, torch.bfloat16):
                x = torch.tensor(VALUES, dtype=dtype)
                x = x.repeat((n + len(VALUES) - 1) // len(VALUES))[:max(n, len(VALUES))] if n > 7 else x
                got = torch.cat([fn(x[i:i + n]) for i in range(0, len(x), n)]).double()
                exact = fn(x.double()).to(dtype).double()
                bad = (got.isnan() != exact.isnan()) | (got.isinf() != exact.isinf()) | (
                    (got - exact).abs() > 1e-2 * exact.abs() + 1e-5)
                bad &= ~(got.isnan() & exact.isnan())
                if bad.any():
                    at = bad.nonzero().flatten().tolist()[:8]
                    print(f"  {name:14} n={n:2} {str(dtype)[6:]:8} x={[x[i].item() for i in at]} "
                          f"got={[got[i].item() for i in at]} float64={[exact[i].item() for i in at]}")
    print("  (end)", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        probe()
    else:
        for cap in ("default", "avx2", "avx512"):
            env = dict(os.environ, ATEN_CPU_CAPABILITY=cap)
            r = subprocess.run([sys.executable, __file__, "--one"], env=env, capture_output=True, text=True,
                               check=False)
            print(r.stdout or f"{cap}: rc {r.returncode} {r.stderr[-200:]}", flush=True)
