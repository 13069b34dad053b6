"""The two gated grouped GEMMs of the MoE expert MLP, one tile config against another: FC1's
forward (SwiGLU and router probabilities in the epilogue, z saved) and FC2's dgrad through
the gate (dz, dprobs and h from z in the epilogue), bf16, at the Mixtral-8x7B and
Qwen3-30B-A3B shapes, uniform random routing.

Each candidate's outputs are checked against the table's (relative error, bf16 rounding)
before it is timed; candidates are timed in interleaved rounds (medians).

    python -m benchmarks.gated_gemm [--kernels fwd dgrad] [--candidates table dgrad_tma8 ...]

Writes ``benchmarks/results/gated_gemm-<gpu>-<date>.json`` (``--out``); prints a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from benchmarks._results import results_path
from benchmarks._timing import interleaved_medians
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import grouped_gated as ggg
from fuseops.kernels.gemm import grouped_gated_bwd as ggg_bwd

SHAPES = {
    "mixtral-8x7b": dict(E=8, M=16384, H=4096, I=14336),
    "qwen3-30b-a3b": dict(E=128, M=262144, H=2048, I=768),
}

_FWD = ggg.GatedGemmConfig(128, 128, 64, 8, 8, 4, epilogue_parts=2, flatten=False, warp_specialize=True)
_DGRAD = ggg.GatedGemmConfig(128, 256, 64, 8, 8, 3, epilogue_parts=8)
_PTR = dict(tma_epilogue_loads=False, tma_epilogue_stores=False)
# name -> (kernel, config); None is the launcher's own table.
CANDIDATES = {
    "table": ("both", None),
    "fwd_ptr2": ("fwd", dataclasses.replace(_FWD, tma_epilogue_stores=False)),
    "fwd_ptr1": ("fwd", dataclasses.replace(_FWD, epilogue_parts=1, tma_epilogue_stores=False)),
    "dgrad_tma8": ("dgrad", _DGRAD),
    "dgrad_zptr8": ("dgrad", dataclasses.replace(_DGRAD, tma_epilogue_loads=False)),
    "dgrad_ptr16": ("dgrad", dataclasses.replace(_DGRAD, epilogue_parts=16, **_PTR)),
    "dgrad_ptr8_s4": ("dgrad", dataclasses.replace(_DGRAD, num_stages=4, **_PTR)),
    "dgrad_ptr8_nf": ("dgrad", dataclasses.replace(_DGRAD, flatten=False, **_PTR)),
    "dgrad_ptr4_128": ("dgrad", dataclasses.replace(_DGRAD, block_n=128, num_stages=4, epilogue_parts=4, **_PTR)),
    # One band of M tiles per expert at Mixtral's ~2048 rows: B read once per expert, not twice
    # (a model of the wave's HBM reads saves ~1 GB a step at the gated forward).
    "fwd_gm16": ("fwd", dataclasses.replace(_FWD, group_m=16)),
    "dgrad_ptr8_gm16": ("dgrad", dataclasses.replace(_DGRAD, group_m=16, **_PTR)),
}


def routing_offsets(E: int, M: int, device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(0)
    counts = torch.bincount(torch.randint(0, E, (M,), generator=g), minlength=E)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(device)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def cases(shape: dict, kernel: str, want_h: bool):
    """(a function from a config, None for the table, to a call of the kernel; the flop count)."""
    E, M, H, I = shape["E"], shape["M"], shape["H"], shape["I"]
    kw = dict(device="cuda", dtype=torch.bfloat16)
    torch.manual_seed(0)
    offsets = routing_offsets(E, M, "cuda")
    probs = torch.rand(M, **kw)
    if kernel == "fwd":
        x, w1 = torch.randn(M, H, **kw), torch.randn(E, 2 * I, H, **kw) / H**0.5

        def call(cfg):
            return lambda: ggg.launch_grouped_gemm_gated(x, w1.transpose(1, 2), offsets, None, Activation.SILU,
                                                         False, False, 7.0, 1.0, probs, True, None, cfg)

        return call, 2.0 * M * H * 2 * I
    dy, z = torch.randn(M, H, **kw), torch.randn(M, 2 * I, **kw)
    w2 = torch.randn(E, H, I, **kw) / I**0.5

    def call(cfg):
        return lambda: ggg_bwd.launch_grouped_gemm_dgrad_gated(dy, w2, offsets, z, Activation.SILU, False, False,
                                                               7.0, 1.0, probs, want_h, None, cfg)

    return call, 2.0 * M * H * I


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--kernels", nargs="*", default=["fwd", "dgrad"], choices=["fwd", "dgrad"])
    parser.add_argument("--candidates", nargs="*", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--no-h", action="store_true", help="dgrad without h (want_h=False)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep", type=int, default=100)
    parser.add_argument("--out", type=Path, help="JSON path (default results/gated_gemm-<gpu>-<date>.json)")
    args = parser.parse_args()
    rows = []
    for shape_name in args.shapes:
        for kernel in args.kernels:
            call, flops = cases(SHAPES[shape_name], kernel, not args.no_h)
            ref = call(None)()
            fns = {}
            for name in args.candidates:
                which, cfg = CANDIDATES[name]
                if which not in (kernel, "both"):
                    continue
                fn = call(cfg)
                errs = [rel_err(o, r) for o, r in zip(fn(), ref) if o is not None]
                print(f"{shape_name} {kernel} {name}: rel err vs table {max(errs):.1e}", flush=True)
                fns[name] = fn
            times = interleaved_medians(fns, args.rounds, rep=args.rep)
            for name, ms in times.items():
                rows.append(dict(shape=shape_name, kernel=kernel, candidate=name, ms=ms,
                                 tflops=flops / ms / 1e9, want_h=not args.no_h))
    print(f"\n{'shape':<15}{'kernel':<7}{'candidate':<16}{'ms':>8}{'TFLOP/s':>9}")
    for r in rows:
        print(f"{r['shape']:<15}{r['kernel']:<7}{r['candidate']:<16}{r['ms']:>8.3f}{r['tflops']:>9.0f}")
    out = args.out or results_path("gated_gemm")
    out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), indent=1))


if __name__ == "__main__":
    main()
