"""The per-tensor quantize passes of one FP8-current-scaling MoE step, standalone at their shapes.

One forward+backward of the expert layer at Qwen3-30B-A3B (E=128, T=32768, top-8: 262144
routed rows, H=2048, I=768) quantizes four grouped tensors, each row-wise and column-wise in
one cast pass: FC1's input
[262144, 2048] (E4M3), FC2's input h [262144, 768] (E4M3), FC2's output gradient [262144, 2048]
and FC1's [262144, 1536] (E5M2); three of them after an amax pass (on an H100 a profile of the
whole step splits ~4 ms of cast and ~1 ms of amax between them). This times each call alone,
from CUDA graphs, as bytes moved over a device copy's rate, and sweeps the cast's tiles for
the grouped row+column case (every candidate's buffers checked bit for bit against the
default tiling's first), and times each copy alone. For the token-side tensors (x_sorted, dy_sorted) it also times what
``expert_layer``'s quantized Function runs instead: the cast reading each sorted row
from the [T, C] tokens through ``rows`` (no permuted copy written), and the group amaxes from the
tokens' row amaxes (``row_amax``, one read of the tokens) in place of the amax pass; both checked
bit for bit against the permuted tensor's.

    python -m benchmarks.moe_quantize [--tokens 32768] [--top-k 8] [--experts 128] [--smoke]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.quantize import bench, graph_ms, nbytes
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.quantization import amax as ka
from fuseops.kernels.quantization import quantize as kq
from fuseops.kernels.quantization.formats import Element, Scaling, tensor_encode_scale

# (name, columns, element) of the four quantized tensors.
TENSORS = [("FC1 input x_sorted", 2048, Element.E4M3), ("FC2 input h", 768, Element.E4M3),
           ("FC2 grad dy_sorted", 2048, Element.E5M2), ("FC1 grad dz", 1536, Element.E5M2)]
Q = kq.QuantizeConfig
# sm_90a registers (ptxas, offline, grouped 128 experts; E4M3 / E5M2): 128x128 at 4 warps holds 16
# rows a thread and spills; with the plain cast (non-finite codes written afterwards, off the
# per-element path) 128x64 takes 80 registers for both elements and 128x128 168, without spills.
# This sweep timed 128x64 fastest on every tensor read in place (``quantize._GROUPED_TENSOR``)
# and 128x128 in program order fastest for the gathered casts (``quantize._GATHERED_TENSOR``).
# A per-call table of each row tile's group (instead of every program searching the offsets)
# timed within 1-3 % of the search at 128 and at 8 groups: the search is not what bounds the cast.
CANDIDATES = [Q(128, 128, 4), Q(128, 128, 4, group_r=8), Q(128, 64, 4), Q(64, 128, 4), Q(128, 128, 8),
              Q(64, 256, 8), Q(32, 256, 4)]


def timed(fn) -> float:
    """Milliseconds per call from a CUDA graph (eager if the capture fails); on the CPU (the
    interpreter: ``--smoke`` checks the script) the call runs once and NaN is returned."""
    if not torch.cuda.is_available():
        fn()
        return float("nan")
    return graph_ms(fn) or bench(fn)


def routing(tokens: int, experts: int, top_k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random top-k routing (as benchmarks.moe_layer's cases route): rows per expert, and each
    sorted row's token (rows sorted by expert, stably: a group's tokens ascend, as permute's)."""
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randn(tokens, experts, device=device, generator=g).topk(top_k, dim=-1).indices
    order = torch.argsort(ids.flatten(), stable=True)
    return torch.bincount(ids.flatten(), minlength=experts), order // top_k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1, a tiny shape")
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.tokens, args.top_k, args.experts = 32, 2, 4
    sizes, token_of_row = routing(args.tokens, args.experts, args.top_k, device)
    offsets = group_offsets(sizes)
    rows = args.tokens * args.top_k
    print(f"{rows} rows in {args.experts} groups ({int(sizes.min())}..{int(sizes.max())} rows)")
    # Group amaxes from a producer's row amaxes (fuseops.quant.emit): the amax kernel over
    # them, against a scatter_reduce_.
    row_amax = torch.rand(rows, device=device)
    group = torch.searchsorted(offsets[1:], torch.arange(rows, device=device), right=True)
    ms_kernel = timed(lambda: ka.amax(row_amax.view(1, rows, 1), offsets, args.experts))
    ms_scatter = timed(lambda: torch.zeros(args.experts, device=device).scatter_reduce_(0, group, row_amax, "amax"))
    print(f"group amax from row amaxes: amax kernel {ms_kernel:.4f} ms, scatter_reduce_ {ms_scatter:.4f} ms")
    for name, cols, element in TENSORS:
        cols = cols // 16 if args.smoke else cols
        x = torch.randn(1, rows, cols, device=device, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        copy_ms = timed(lambda: y.copy_(x))
        copy_rate = 2 * nbytes(x) / copy_ms
        amax_ms = timed(lambda: ka.amax(x, offsets, args.experts))
        enc = tensor_encode_scale(ka.amax(x, offsets, args.experts), Scaling.TENSOR, element)
        kw = dict(scaling=Scaling.TENSOR, element=element, rowwise=True, columnwise=True)
        ref = kq.quantize(x, offsets, enc, **kw)
        moved = nbytes(x) + nbytes(ref.data, ref.data_t)
        print(f"\n{name} [{rows}, {cols}] {element.name}: copy {copy_ms:.3f} ms; amax pass {amax_ms:.3f} ms "
              f"({nbytes(x) / amax_ms / 1e9:.2f} TB/s read, {nbytes(x) / amax_ms / copy_rate:.2f} of copy's rate)")
        if "_sorted" in name:
            gathered(x, offsets, token_of_row, kw, moved, copy_rate, args)
        one_copy(x, offsets, enc, element, args.experts, copy_rate)
        for cfg in CANDIDATES:
            out = kq.allocate(tuple(x.shape), args.experts, block_2d=False, device=x.device, **kw)
            try:
                fn = lambda: kq.launch_quantize(x, offsets, enc, Scaling.TENSOR, element, False, True, True, out, cfg)  # noqa: E731
                fn()
                same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                           for a, b in ((out.data, ref.data), (out.data_t, ref.data_t)))
                ms = timed(fn)
            except Exception as exc:  # a candidate that does not compile is reported, not fatal
                print(f"  cast {cfg}: {exc!r}"[:160])
                continue
            print(f"  cast {cfg}: {ms:.3f} ms, {moved / ms / 1e9:.2f} TB/s, {moved / ms / copy_rate:.2f} of copy"
                  f"{'' if same else '  BITS DIFFER'}", flush=True)


def one_copy(x, offsets, enc, element, experts, copy_rate) -> None:
    """Each copy alone (default tiling): the row-wise cast writes along rows, the column-wise
    one transposes (each program writes its tile's columns as 128-byte runs); if the column-wise
    alone runs well below the row-wise, the transposed store is what bounds the cast of both."""
    for rowwise in (True, False):
        kw = dict(scaling=Scaling.TENSOR, element=element, rowwise=rowwise, columnwise=not rowwise)
        out = kq.quantize(x, offsets, enc, **kw)
        moved = nbytes(x) + nbytes(out.data if rowwise else out.data_t)
        ms = timed(lambda: kq.quantize(x, offsets, enc, **kw))  # noqa: B023
        print(f"  {'row-wise' if rowwise else 'column-wise'} copy alone (default tiling): {ms:.3f} ms, "
              f"{moved / ms / 1e9:.2f} TB/s, {moved / ms / copy_rate:.2f} of copy", flush=True)


def gathered(like, offsets, token_of_row, kw, moved, copy_rate, args) -> None:
    """The quantized expert layer's form of one token-side cast: the tokens [T, C] and each sorted
    row's token (``x_sorted[r] = tokens[token_of_row[r]]``), in the default tiling and each
    candidate's. The picks are in permute's order (a group's tokens ascend), as the layer makes
    them; with rows picked at random the tilings rank differently (H100: 128x128 in groups of 8
    0.755 ms against 128x64's 0.679)."""
    tokens = torch.randn(args.tokens, like.shape[2], device=like.device, dtype=like.dtype)
    x_sorted = tokens[token_of_row][None]  # the composition's permuted copy, for the bits
    enc = tensor_encode_scale(ka.amax(x_sorted, offsets, args.experts), Scaling.TENSOR, kw["element"])
    ref = kq.quantize(x_sorted, offsets, enc, **kw)

    def report(label, fn, got) -> None:
        same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, ref) if a is not None)
        ms = timed(fn)
        print(f"  gathered cast (rows=, {label}): {ms:.3f} ms, {moved / ms / 1e9:.2f} TB/s, "
              f"{moved / ms / copy_rate:.2f} of copy{'' if same else '  BITS DIFFER'}", flush=True)

    default = lambda: kq.quantize(tokens[None], offsets, enc, rows=token_of_row, **kw)  # noqa: E731
    report("default tiling", default, default())
    for cfg in CANDIDATES:
        out = kq.allocate(tuple(like.shape), args.experts, block_2d=False, device=like.device, **kw)
        fn = lambda: kq.launch_quantize(tokens[None], offsets, enc, Scaling.TENSOR, kw["element"], False,  # noqa: E731
                                        True, True, out, cfg, rows=token_of_row)
        try:
            fn()
        except Exception as exc:  # a candidate that does not compile is reported, not fatal
            print(f"  gathered cast {cfg}: {exc!r}"[:160])
            continue
        report(str(cfg), fn, out)
    picked_amax = lambda: ka.amax(ka.row_amax(tokens).index_select(0, token_of_row).view(1, -1, 1),  # noqa: E731
                                  offsets, args.experts)
    same = torch.equal(picked_amax(), ka.amax(x_sorted, offsets, args.experts))
    print(f"  group amaxes from the tokens' row amaxes: {timed(picked_amax):.3f} ms (row_amax alone "
          f"{timed(lambda: ka.row_amax(tokens)):.3f}){'' if same else '  BITS DIFFER'}", flush=True)


if __name__ == "__main__":
    main()
