"""The warp-specialized FP8 per-tensor grouped GEMM (Gluon, sm_90; its consumers on alternate
tiles) against float64 and, element by element, against the Triton kernel it replaces: ragged
groups (empty, one row, across tile edges, one holding everything, many, so that both consumers
meet short and long walks), N and K tails, bf16 / fp16 outputs, bias, E5M2
gradients against an E4M3 weight (dgrad), several tiles a program of more K steps than the ring
has stages, the dispatch table's route, which calls it serves, and a CUDA graph replayed on
other split sizes. GPU only: Gluon does not run in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.gemm.dense_scaled import pick_config
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_scaled import launch_grouped_gemm_scaled
from fuseops.kernels.hopper import tensor_scaled
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantization.operand import Operand
from tests.helpers import HOPPER_SPLITS, SM90_ONLY, assert_close_rel, dispatched, poison_
from tests.kernels.gemm.test_grouped_scaled import oracle_forward, quantized

pytestmark = SM90_ONLY

# (K, N): multiples of the tiles, and tails of both (still 16-byte rows for TMA).
SHAPES = {"even": (256, 512), "tails": (208, 200)}


def _rows(split: str, K: int, element: Element) -> tuple[torch.Tensor, Operand]:
    sizes = HOPPER_SPLITS[split]
    offsets = group_offsets(torch.tensor(sizes, device="cuda"))
    bufs, outer = quantized(torch.randn(1, sum(sizes), K, device="cuda"), offsets, len(sizes), Scaling.TENSOR,
                            element)
    return offsets, Operand(bufs.data[0], None, outer)


def _weight(G: int, N: int, K: int) -> Operand:
    w, outer = quantized(torch.randn(G, N, K, device="cuda"), None, G, Scaling.TENSOR, Element.E4M3)
    return Operand(w.data, None, outer)


def _triton(a: Operand, b: Operand, offsets: torch.Tensor, out_dtype: torch.dtype, bias=None) -> torch.Tensor:
    cfg = pick_config(Scaling.TENSOR, True, out_dtype == torch.float32)
    return launch_grouped_gemm_scaled(a, b, offsets, Scaling.TENSOR, out_dtype, bias, None, cfg)


def _with_bias(y: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    bounds = offsets.tolist()
    for g in range(bias.shape[0]):
        y[bounds[g]:bounds[g + 1]] += bias[g].double()
    return y


@pytest.mark.parametrize("split", HOPPER_SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_forward(split, shape, out_dtype):
    K, N = SHAPES[shape]
    offsets, a = _rows(split, K, Element.E4M3)
    G = offsets.shape[0] - 1
    b = _weight(G, N, K)
    bias = torch.randn(G, N, device="cuda").to(out_dtype)
    kw = {"scaling": Scaling.TENSOR, "out_dtype": out_dtype, "bias": bias}
    out = poison_(torch.empty(a.data.shape[0], N, device="cuda", dtype=out_dtype))
    assert tensor_scaled.serves_grouped_gemm_scaled(a, b, offsets, out=out, **kw)
    y = tensor_scaled.grouped_gemm_scaled(a, b, offsets, out=out, **kw)
    assert y is out
    expected = _with_bias(oracle_forward(a, b, offsets, Scaling.TENSOR), bias, offsets)
    # Every row written (the poison is gone), none beyond tolerance.
    assert_close_rel(y, expected, out_dtype, what=f"{split} {shape}")
    torch.testing.assert_close(y, _triton(a, b, offsets, out_dtype, bias), rtol=1e-2, atol=1e-2)


def test_dgrad_e5m2_gradients():
    """dgrad's form: E5M2 dy against the weight's column-wise copy (here a transposed view,
    read from a contiguous copy as the launcher does)."""
    N, K = 208, 200  # dy [M, N] (16-byte rows), the weight [G, N, K], dx [M, K]
    offsets, dy = _rows("ragged", N, Element.E5M2)
    G = offsets.shape[0] - 1
    w = _weight(G, N, K)
    b = Operand(w.data.transpose(1, 2), None, w.outer)  # [G, K, N], strided along N
    kw = {"scaling": Scaling.TENSOR, "out_dtype": torch.bfloat16}
    assert tensor_scaled.serves_grouped_gemm_scaled(dy, b, offsets, **kw)
    y = tensor_scaled.grouped_gemm_scaled(dy, b, offsets, **kw)
    assert_close_rel(y, oracle_forward(dy, b, offsets, Scaling.TENSOR), torch.bfloat16)
    torch.testing.assert_close(y, _triton(dy, b, offsets, torch.bfloat16), rtol=1e-2, atol=1e-2)


def test_the_dispatch_table_routes_here(monkeypatch):
    """Ops reach this kernel through the dispatch table's sm_90 row (the Triton kernel gives the
    same bits here, so the launch itself is counted)."""
    K, N = SHAPES["even"]
    offsets, a = _rows("ragged", K, Element.E4M3)
    b = _weight(offsets.shape[0] - 1, N, K)
    launches = []
    real = tensor_scaled.grouped_tensor_scaled

    def counted(*args, **kwargs):
        launches.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tensor_scaled, "grouped_tensor_scaled", counted)
    y = dispatched(Kernel.GROUPED_GEMM_SCALED)(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.bfloat16)
    assert launches == [1]
    assert_close_rel(y, oracle_forward(a, b, offsets, Scaling.TENSOR), torch.bfloat16)


def test_what_it_serves():
    """Per-tensor FP8 with TMA-ready operands into bf16 / fp16; not float32 outputs (their
    staging does not fit beside the ring), other formats, per-row scales or unaligned rows."""
    K, N = SHAPES["even"]
    offsets, a = _rows("ragged", K, Element.E4M3)
    b = _weight(offsets.shape[0] - 1, N, K)
    serves = tensor_scaled.serves_grouped_gemm_scaled
    assert serves(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.bfloat16)
    assert not serves(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.float32)
    assert not serves(a, b, offsets, scaling=Scaling.BLOCK, out_dtype=torch.bfloat16)
    per_row = Operand(b.data, None, torch.ones(b.data.shape[:2], device="cuda"), outer_per_row=True)
    assert not serves(a, per_row, offsets, scaling=Scaling.TENSOR, out_dtype=torch.bfloat16)
    offsets72, a72 = _rows("ragged", 72, Element.E4M3)
    assert not serves(a72, _weight(offsets72.shape[0] - 1, N, 72), offsets72, scaling=Scaling.TENSOR,
                      out_dtype=torch.bfloat16)


def many_tiles_each(gemm) -> None:
    """``gemm`` where each persistent program walks several tiles of more K steps than the ring
    has stages (8192 rows over three groups and an empty one, K = 768, N = 1024): the ring's
    phases carried from tile to tile (in the ping-pong kernel, a consumer's ring count jumps past
    the other's tile), against float64 and the Triton kernel."""
    sizes = [3000, 0, 2500, 2692]
    offsets = group_offsets(torch.tensor(sizes, device="cuda"))
    bufs, outer = quantized(torch.randn(1, sum(sizes), 768, device="cuda"), offsets, len(sizes), Scaling.TENSOR,
                            Element.E4M3)
    a, b = Operand(bufs.data[0], None, outer), _weight(len(sizes), 1024, 768)
    y = gemm(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.bfloat16)
    assert_close_rel(y, oracle_forward(a, b, offsets, Scaling.TENSOR), torch.bfloat16)
    torch.testing.assert_close(y, _triton(a, b, offsets, torch.bfloat16), rtol=1e-2, atol=1e-2)


def test_many_tiles_each():
    many_tiles_each(tensor_scaled.grouped_gemm_scaled)


def replays_on_new_split_sizes(gemm) -> None:
    """``gemm(a, b, offsets, scaling=, out_dtype=)`` captured in a CUDA graph, then replayed after
    every token of group 0 moved to group 2 (the same rows, other groups' scales and tiles): the
    replay equals an eager call on the new offsets and differs from the first result."""
    K, N = SHAPES["even"]
    offsets, a = _rows("ragged", K, Element.E4M3)
    b = _weight(offsets.shape[0] - 1, N, K)

    def run() -> torch.Tensor:
        return gemm(a, b, offsets, scaling=Scaling.TENSOR, out_dtype=torch.bfloat16)

    eager = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    offsets.copy_(group_offsets(torch.tensor([0, 0, 301] + HOPPER_SPLITS["ragged"][3:], device="cuda")))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run())
    assert not torch.equal(captured, eager)


def test_captures_in_a_cuda_graph():
    """No host sync: it replays in a CUDA graph with new split sizes."""
    replays_on_new_split_sizes(tensor_scaled.grouped_gemm_scaled)
