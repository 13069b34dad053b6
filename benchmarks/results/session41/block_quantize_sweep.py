"""Session 41 probe (issue 24): the FP8 blockwise casts of one quantized expert-layer step at Qwen3-30B-A3B in
persistent programs (``QuantizeConfig.persistent``), with and without ``prefetch`` (the next tile's index and value
loads issued before the current tile's arithmetic), against the library's tiling. Session 40's Nsight Compute
reading of the picked casts: 25 % occupancy, each tile waiting on three dependent loads with nothing else in
flight. Session 40's probe with this session's candidates; it runs on the code of
``call4_persistent_casts.patch`` (applied to commit e9cc383; not kept: every persistent tiling was slower).

Session 39's profile of the blockwise layer (call 9): ``quantize_kernel`` 3.02 ms a micro-batch against per-tensor's
1.99, the rest of the difference in the GEMMs. The per-tensor casts of rows picked from the tokens (``rows=``) ran
1.35x faster in program order than in groups of row tiles (session 35, ``quantize._GATHERED_TENSOR``); the
blockwise ones still run in groups of 8. The three casts (E=128, T=32768, top-8: 262144 routed rows): FC1's input
picked from the tokens [32768, 2048] (E4M3), FC2's output gradient picked likewise (E5M2), FC1's gradient dz
[262144, 1536] grouped in place (E5M2); each row-wise and column-wise in one pass. GPU time from CUDA graphs;
each candidate's buffers compared bit for bit with the library's.

    python benchmarks/results/session41/block_quantize_sweep.py [--smoke] [--mixtral]
"""
import sys

import torch

from benchmarks.moe_quantize import routing, timed
from benchmarks.quantize import nbytes
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.quantization import quantize as kq
from fuseops.kernels.quantization.formats import Element, Scaling

SMOKE = "--smoke" in sys.argv
Q = kq.QuantizeConfig
CANDIDATES = [
    Q(128, 128, 8, staged=True, group_r=8, maxnreg=128),  # the library's (session 40: the best of eleven)
    Q(128, 128, 8, staged=True, maxnreg=128, persistent=2),
    Q(128, 128, 8, staged=True, maxnreg=128, persistent=2, prefetch=True),
    Q(128, 128, 8, staged=True, maxnreg=168, persistent=1, prefetch=True),
    Q(128, 128, 8, staged=True, persistent=1, prefetch=True),
    Q(128, 128, 8, staged=True, maxnreg=128, persistent=1, prefetch=True),
    Q(128, 128, 8, maxnreg=128, persistent=2, prefetch=True),
]


def main() -> None:
    device = "cpu" if SMOKE else "cuda"
    mixtral = "--mixtral" in sys.argv  # E=8, H=4096, I=14336, top-2, T=8192
    tokens, top_k, experts = (32, 2, 4) if SMOKE else (8192, 2, 8) if mixtral else (32768, 8, 128)
    hidden, inter2 = (4096, 28672) if mixtral else (2048, 1536)
    sizes, token_of_row = routing(tokens, experts, top_k, device)
    offsets = group_offsets(sizes)
    rows = tokens * top_k
    cases = [("FC1 input x, picked", hidden, Element.E4M3, True), ("FC2 grad dy, picked", hidden, Element.E5M2, True),
             ("FC1 grad dz, grouped", inter2, Element.E5M2, False)]
    library = kq.pick_config(Scaling.BLOCK, False, True, grouped=True, gathered=True)
    print(f"{rows} rows in {experts} groups; the library's tiling {library}", flush=True)
    for name, cols, element, picked in cases:
        cols = 256 if SMOKE else cols
        src = torch.randn(1, tokens if picked else rows, cols, device=device, dtype=torch.bfloat16)
        pick = token_of_row if picked else None
        kw = dict(scaling=Scaling.BLOCK, element=element, rowwise=True, columnwise=True)
        ref = kq.quantize(src, offsets, None, rows=pick, **kw)
        copy_src = torch.randn(1, rows, cols, device=device, dtype=torch.bfloat16)
        copy_dst = torch.empty_like(copy_src)
        copy_ms = timed(lambda: copy_dst.copy_(copy_src))
        copy_rate = 2 * nbytes(copy_src) / copy_ms
        moved = nbytes(copy_src) + nbytes(ref.data, ref.data_t, ref.scale, ref.scale_t)
        lib_ms = timed(lambda: kq.quantize(src, offsets, None, rows=pick, **kw))  # noqa: B023
        print(f"\n{name} [{rows}, {cols}] {element.name}: copy {copy_ms:.3f} ms; library {lib_ms:.3f} ms "
              f"({moved / lib_ms / copy_rate:.2f} of copy)", flush=True)
        for cfg in CANDIDATES:
            out = kq.allocate((1, rows, cols), experts, block_2d=False, device=src.device, **kw)
            fn = lambda: kq.launch_quantize(src, offsets, None, Scaling.BLOCK, element, False, True, True,  # noqa: E731
                                            out, cfg, rows=pick)  # noqa: B023
            try:
                fn()
            except Exception as exc:  # a candidate that does not compile is reported, not fatal
                print(f"  {cfg}: {exc!r}"[:160], flush=True)
                continue
            same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                       for a, b in zip(out, ref) if a is not None)
            ms = timed(fn)
            print(f"  {ms:.3f} ms {lib_ms / ms:5.2f}x  {moved / ms / copy_rate:.2f} of copy  {cfg}"
                  f"{'' if same else '  BITS DIFFER'}", flush=True)


if __name__ == "__main__":
    main()
