"""Session 62: float32 tiles of every grouped GEMM kernel (forward, gated forward, gated dgrad,
wgrad) under "tf32" and "ieee", and "tf32x3" (three TF32 products, close to IEEE accuracy on
the tensor cores) at the candidates that won under tf32; each against the per-expert torch
loop of the same product; the plain forward's relative error against float64 per precision.
Session 61's run 1 (fp32_tiles.py): forward tf32 128x128x32 w8 s3 0.94 ms (2.70x the loop),
ieee 128x256x32 w8 s3 8.33 ms (0.57x), the table's 64x64x32 4.28 / 17.4 ms."""

import contextlib
import sys
import time

import torch

from benchmarks._timing import interleaved_medians
from benchmarks.float32_precision import under
from benchmarks.grouped_gemm import split_sizes
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import grouped, grouped_gated, grouped_gated_bwd, grouped_wgrad
from fuseops.kernels.gemm.grouped import GemmConfig, group_offsets, launch_grouped_gemm
from fuseops.kernels.gemm.grouped_gated import GatedGemmConfig, launch_grouped_gemm_gated
from fuseops.kernels.gemm.grouped_gated_bwd import launch_grouped_gemm_dgrad_gated
from fuseops.kernels.gemm.grouped_wgrad import launch_grouped_gemm_wgrad

E, T, H, F = 64, 32768, 2048, 1408
LIMIT = float(sys.argv[1]) if len(sys.argv) > 1 else 1e9
START = time.time()
g = torch.Generator(device="cuda").manual_seed(0)
sizes = split_sizes(E, T, "uniform")
offsets = group_offsets(torch.tensor(sizes, device="cuda"))
spans = [(sum(sizes[:e]), sum(sizes[:e + 1])) for e in range(E)]
x = torch.randn(T, H, device="cuda", generator=g)
w = torch.randn(E, F, H, device="cuda", generator=g) / H ** 0.5          # [E, F, H]: x @ w[e].T
w1 = torch.randn(E, 2 * F, H, device="cuda", generator=g) / H ** 0.5     # gated FC1
w2 = torch.randn(E, H, F, device="cuda", generator=g) / F ** 0.5         # FC2
z = torch.randn(T, 2 * F, device="cuda", generator=g)
dy_h = torch.randn(T, H, device="cuda", generator=g)
dy_f = torch.randn(T, F, device="cuda", generator=g)
y = torch.empty(T, F, device="cuda")
MODULES = (grouped, grouped_gated, grouped_gated_bwd, grouped_wgrad)


@contextlib.contextmanager
def dot_precision(name):
    """Every grouped kernel's F32_DOT forced to ``name`` (tf32x3 has no torch setting)."""
    saved = [m.float32_dot_precision for m in MODULES]
    for m in MODULES:
        m.float32_dot_precision = lambda dtype, n=name: n if dtype == torch.float32 else "ieee"
    try:
        yield
    finally:
        for m, f in zip(MODULES, saved):
            m.float32_dot_precision = f


def forced(name, fn):
    def run():
        with dot_precision(name):
            return fn()
    return run


KERNELS = {
    "forward": (lambda c: launch_grouped_gemm(x, w.transpose(1, 2), offsets, None, None, 0, 1.0, False, None, y, c),
                lambda: torch.cat([x[s:t] @ w[e].T for e, (s, t) in enumerate(spans)]),
                [GemmConfig(128, 128, 32, 8, 8, 3), GemmConfig(128, 256, 32, 8, 8, 3), GemmConfig(128, 256, 16, 8, 8, 3),
                 GemmConfig(256, 128, 32, 8, 8, 2), GemmConfig(128, 128, 16, 8, 8, 4), GemmConfig(128, 128, 64, 8, 8, 2)]),
    "gated": (lambda c: launch_grouped_gemm_gated(x, w1.transpose(1, 2), offsets, None, Activation.SILU, False, False,
                                                  7.0, 1.0, None, True, None, c),
              lambda: torch.cat([x[s:t] @ w1[e].T for e, (s, t) in enumerate(spans)]),
              [GatedGemmConfig(64, 32, 32, 8, 4, 2), GatedGemmConfig(128, 64, 32, 8, 8, 3),
               GatedGemmConfig(128, 64, 32, 8, 4, 3), GatedGemmConfig(64, 64, 32, 8, 4, 3),
               GatedGemmConfig(128, 128, 32, 8, 8, 2, epilogue_parts=2), GatedGemmConfig(128, 64, 16, 8, 8, 4)]),
    "dgrad_gated": (lambda c: launch_grouped_gemm_dgrad_gated(dy_h, w2, offsets, z, Activation.SILU, False, False, 7.0,
                                                              1.0, None, False, None, c),
                    lambda: torch.cat([dy_h[s:t] @ w2[e] for e, (s, t) in enumerate(spans)]),
                    [GatedGemmConfig(64, 32, 32, 8, 4, 2), GatedGemmConfig(128, 64, 32, 8, 8, 3),
                     GatedGemmConfig(128, 128, 32, 8, 8, 3), GatedGemmConfig(64, 64, 32, 8, 4, 3),
                     GatedGemmConfig(128, 64, 32, 8, 4, 3)]),
    "wgrad": (lambda c: launch_grouped_gemm_wgrad(dy_f, x, offsets, None, None, c, out_dtype=torch.float32),
              lambda: torch.stack([dy_f[s:t].T @ x[s:t] for s, t in spans]),
              [GemmConfig(32, 64, 64, 1, 4, 2), GemmConfig(32, 128, 128, 1, 8, 3), GemmConfig(64, 128, 128, 1, 8, 2),
               GemmConfig(32, 128, 64, 1, 4, 3), GemmConfig(64, 64, 128, 1, 4, 3), GemmConfig(32, 256, 128, 1, 8, 2)]),
}


def timed(fn):
    t0 = time.time()
    fn()
    torch.cuda.synchronize()
    compile_s = time.time() - t0
    return interleaved_medians({"f": fn}, rounds=1, warmup=5, rep=20)["f"], compile_s


def main():
    ref = torch.cat([x[s:t].double() @ w[e].T.double() for e, (s, t) in enumerate(spans)])
    for name in ("ieee", "tf32", "tf32x3"):
        with dot_precision(name):
            launch_grouped_gemm(x, w.transpose(1, 2), offsets, None, None, 0, 1.0, False, None, y,
                                GemmConfig(128, 128, 32, 8, 8, 3))
        print(f"forward rel_err {name}: {float((y.double() - ref).norm() / ref.norm()):.3e}", flush=True)
    for p in ("ieee", "tf32"):
        out = under(p, lambda: torch.cat([x[s:t] @ w[e].T for e, (s, t) in enumerate(spans)]))()
        print(f"torch loop rel_err {p}: {float((out.double() - ref).norm() / ref.norm()):.3e}", flush=True)
    del ref
    for kernel, (launch, loop, candidates) in KERNELS.items():
        base = interleaved_medians({p: under(p, loop) for p in ("ieee", "tf32")}, rounds=1, warmup=3, rep=20)
        print(f"{kernel}: torch loop ieee {base['ieee']:.3f} ms, tf32 {base['tf32']:.3f} ms", flush=True)
        best = {}
        for cfg in candidates:
            for precision in ("tf32", "ieee", "tf32x3"):
                if time.time() - START > LIMIT:
                    print("stopped at the time limit", flush=True)
                    return
                fn = forced(precision, lambda c=cfg: launch(c))
                try:
                    ms, compile_s = timed(fn)
                except Exception as e:  # noqa: BLE001 - a candidate that does not compile is a result
                    print(f"  {precision} {cfg}: failed {type(e).__name__}: {str(e)[:100]}", flush=True)
                    continue
                loop_ms = base["ieee" if precision != "tf32" else "tf32"]
                print(f"  {precision:6} {cfg}: {ms:.3f} ms (compile {compile_s:.0f} s), {loop_ms / ms:.2f}x the loop",
                      flush=True)
                if ms < best.get(precision, (1e9,))[0]:
                    best[precision] = (ms, cfg)
        for precision, (ms, cfg) in best.items():
            print(f"{kernel} best {precision}: {ms:.3f} ms {cfg}", flush=True)


main()
