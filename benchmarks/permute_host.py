"""Host microseconds per call of the MoE routing on the GPU: ``moe.permute`` and
``moe.unpermute`` (forward, and forward+backward), at the OLMoE shape of
``benchmarks.sizes`` (T=1024, E=64, top-8, H=2048), with a cProfile of the permute calls and
the fast launch's hits against Triton's path (issue 20: ``benchmarks.host_trace --part moe``
put ``_Permute``'s own Python at ~220 us a step on the H100 host, where
``benchmarks.launcher_prep --through-launch`` counts ~40 us for its launches on a CPU).

    FUSEOPS_CHECK_LAUNCH=1 python -m benchmarks.permute_host [--tokens 1024] [--top 25]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks._timing import profile_table, profiled
from benchmarks.host_costs import host_us
from benchmarks.sizes import routing
from fuseops import moe
from fuseops.kernels import launch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    E, H, K = 64, 2048, 8
    x = torch.randn(args.tokens, H, device="cuda", dtype=torch.bfloat16)
    ids, weights = routing(args.tokens, E, K, False, "cuda")
    xg = x.clone().requires_grad_()
    x_sorted, _, row_map = moe.permute(x, ids, E)

    def fwd_bwd() -> None:
        xs, _, rm = moe.permute(xg, ids, E)
        moe.unpermute(xs, rm, weights).sum().backward()

    rows = {
        "moe.permute": lambda: moe.permute(x, ids, E),
        "moe.unpermute": lambda: moe.unpermute(x_sorted, row_map, weights),
        "permute + unpermute, fwd+bwd": fwd_bwd,
        "torch.empty (for scale)": lambda: torch.empty(args.tokens, H, device="cuda", dtype=torch.bfloat16),
    }
    for name, fn in rows.items():
        print(f"{name:36s} {host_us(fn, 1000):8.1f} us")
    launch.counts.update(fast=0, triton=0)
    prof = profiled(lambda: moe.permute(x, ids, E), 500)
    torch.cuda.synchronize()
    print(f"fast launch counts over 500 permutes (FUSEOPS_CHECK_LAUNCH=1 counts them): {launch.counts}")
    print(profile_table(prof, "tottime", args.top))


if __name__ == "__main__":
    main()
