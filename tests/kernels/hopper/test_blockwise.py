"""The warp-specialized FP8 blockwise kernels (Gluon, sm_90) against float64 and, element by
element, against the Triton kernels they replace: ragged groups (empty, tiny, across tile
edges, one holding everything), N and K tails, every output dtype, bias, E5M2 gradients,
per-row weight scales, many groups, and the dense GEMMs (forward, dgrad, wgrad) run as one
group; forward and wgrad in a CUDA graph. The grouped wgrad alone:
hopper/test_blockwise_wgrad.py. GPU only: Gluon does not run in Triton's
interpreter.
"""

from __future__ import annotations

import pytest
import torch

import fuseops
from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.gemm.dense_scaled import launch_gemm_scaled, pick_config, reference_gemm_scaled
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_scaled import launch_grouped_gemm_scaled
from fuseops.kernels.hopper import blockwise as hopper
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantization.operand import Operand
from tests.helpers import HOPPER_SPLITS, SM90_ONLY, assert_close_rel, dispatched, poison_
from tests.kernels.gemm.test_grouped_scaled import oracle_forward, quantized

# The launchers as ops reach them: through the dispatch table (the Gluon kernels on sm_90).
gemm_scaled = dispatched(Kernel.GEMM_SCALED)
grouped_gemm_scaled = dispatched(Kernel.GROUPED_GEMM_SCALED)
grouped_gemm_scaled_wgrad = dispatched(Kernel.GROUPED_GEMM_SCALED_WGRAD)

pytestmark = SM90_ONLY

SPLITS = HOPPER_SPLITS
# (K, N): multiples of 128, and tails of both (still 16-byte rows for TMA).
SHAPES = {"even": (256, 384), "tails": (208, 200)}


def _rows(split: str, K: int, element: Element):
    sizes = SPLITS[split]
    offsets = group_offsets(torch.tensor(sizes, device="cuda"))
    bufs, _ = quantized(torch.randn(1, sum(sizes), K, device="cuda"), offsets, len(sizes), Scaling.BLOCK, element)
    return offsets, bufs


def _weight(G: int, N: int, K: int, block_2d: bool) -> Operand:
    w, _ = quantized(torch.randn(G, N, K, device="cuda"), None, G, Scaling.BLOCK, Element.E4M3, block_2d)
    return Operand(w.data, w.scale, None, 128 if block_2d else 1)


def _triton(a, b, offsets, out_dtype, bias=None):
    cfg = pick_config(Scaling.BLOCK, True, out_dtype == torch.float32)
    return launch_grouped_gemm_scaled(a, b, offsets, Scaling.BLOCK, out_dtype, bias, None, cfg)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_forward(split, shape, out_dtype):
    K, N = SHAPES[shape]
    offsets, x = _rows(split, K, Element.E4M3)
    G = offsets.shape[0] - 1
    a, b = Operand(x.data[0], x.scale[0]), _weight(G, N, K, block_2d=True)
    assert hopper.usable(a.data, b.data)
    bias = torch.randn(G, N, device="cuda").to(out_dtype)
    out = poison_(torch.empty(a.data.shape[0], N, device="cuda", dtype=out_dtype))
    y = grouped_gemm_scaled(a, b, offsets, scaling=Scaling.BLOCK, out_dtype=out_dtype, bias=bias, out=out)
    assert y is out
    expected = oracle_forward(a, b, offsets, Scaling.BLOCK)
    bounds = offsets.tolist()
    for g in range(G):
        expected[bounds[g]:bounds[g + 1]] += bias[g].double()
    # Every row written (the poison is gone), none beyond tolerance.
    assert_close_rel(y, expected, out_dtype, 100.0 if out_dtype == torch.float32 else 1.0, what=f"{split} {shape}")
    torch.testing.assert_close(y, _triton(a, b, offsets, out_dtype, bias), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("block_2d", [True, False])
def test_dgrad_e5m2_gradients(block_2d):
    """dgrad's form: E5M2 dy against the weight's column-wise copy, 128x128 or per-row scales."""
    K, N = SHAPES["tails"]
    offsets, dy = _rows("ragged", N, Element.E5M2)
    G = offsets.shape[0] - 1
    a, b = Operand(dy.data[0], dy.scale[0]), _weight(G, K, N, block_2d)
    y = grouped_gemm_scaled(a, b, offsets, scaling=Scaling.BLOCK, out_dtype=torch.bfloat16)
    assert_close_rel(y, oracle_forward(a, b, offsets, Scaling.BLOCK), torch.bfloat16, what=f"block_2d={block_2d}")
    torch.testing.assert_close(y, _triton(a, b, offsets, torch.bfloat16), rtol=1e-2, atol=1e-2)


def test_unaligned_rows_take_the_triton_kernel():
    """K = 72 float8 bytes a row: no TMA descriptor, so the Triton pointer path runs."""
    offsets, x = _rows("ragged", 72, Element.E4M3)
    G = offsets.shape[0] - 1
    a, b = Operand(x.data[0], x.scale[0]), _weight(G, 128, 72, block_2d=True)
    assert not hopper.usable(a.data, b.data)
    y = grouped_gemm_scaled(a, b, offsets, scaling=Scaling.BLOCK, out_dtype=torch.float32)
    assert_close_rel(y, oracle_forward(a, b, offsets, Scaling.BLOCK), torch.float32, 100.0)


def test_captures_in_a_cuda_graph():
    """No host sync: forward and wgrad replay in a CUDA graph with new split sizes."""
    K, N = SHAPES["even"]
    offsets, x = _rows("ragged", K, Element.E4M3)
    _, dy = _rows("ragged", N, Element.E5M2)
    G = offsets.shape[0] - 1
    a, b = Operand(x.data[0], x.scale[0]), _weight(G, N, K, block_2d=True)
    a_t, b_t = Operand(dy.data_t[0], dy.scale_t[0]), Operand(x.data_t[0], x.scale_t[0])
    run = lambda: (grouped_gemm_scaled(a, b, offsets, scaling=Scaling.BLOCK, out_dtype=torch.bfloat16),  # noqa: E731
                   grouped_gemm_scaled_wgrad(a_t, b_t, offsets, scaling=Scaling.BLOCK, out_dtype=torch.float32))
    eager = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    # Move every token of group 0 to group 2: the same total rows, other tiles.
    moved = group_offsets(torch.tensor([0, 0, 301] + SPLITS["ragged"][3:], device="cuda"))
    offsets.copy_(moved)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], run()[0]) and torch.equal(captured[1], run()[1])
    assert not torch.equal(captured[1], eager[1])


def test_dense_captures_in_a_cuda_graph():
    """The dense path makes its one-group offsets on the device: it captures, and replays on
    new data."""
    recipe = fuseops.recipes.FP8Blockwise()
    x = torch.randn(256, 384, device="cuda")
    w = fuseops.quantize(torch.randn(128, 384, device="cuda"), recipe, role="weight")
    run = lambda: gemm_scaled(fuseops.quantize(x, recipe).rowwise_operand(), w.rowwise_operand(),  # noqa: E731
                              scaling=Scaling.BLOCK, out_dtype=torch.float32)
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run())


@pytest.mark.parametrize("M", [304, 1])
@pytest.mark.parametrize("accumulate", [False, True])
def test_dense_linear_gemms(M, accumulate):
    """gemm_scaled's BLOCK path runs as one group: forward, dgrad, and wgrad from the
    column-wise copies (per-row scales on both sides), into main_grad with ``accumulate``."""
    K, N = 256, 208
    recipe = fuseops.recipes.FP8Blockwise()
    x = fuseops.quantize(torch.randn(M, K, device="cuda"), recipe, columnwise=True)
    w = fuseops.quantize(torch.randn(N, K, device="cuda"), recipe, role="weight", columnwise=True)
    dy = fuseops.quantize(torch.randn(M, N, device="cuda"), recipe, role="grad", columnwise=True)
    cases = {"forward": (x.rowwise_operand(), w.rowwise_operand()),
             "dgrad": (dy.rowwise_operand(), w.columnwise_operand()),
             "wgrad": (dy.columnwise_operand(), x.columnwise_operand())}
    for name, (a, b) in cases.items():
        # M = 1: wgrad's rows hold one position, not 16 bytes, so the Triton kernel runs it.
        assert hopper.usable(a.data, b.data) == (M > 1 or name != "wgrad"), name
        cfg = pick_config(Scaling.BLOCK, hopper.usable(a.data, b.data), True)
        initial = torch.randn(a.data.shape[0], b.data.shape[0], device="cuda") if accumulate else None
        if accumulate:
            main_grad = initial.clone()
            got = gemm_scaled(a, b, scaling=Scaling.BLOCK, out_dtype=torch.bfloat16, main_grad=main_grad)
            assert got is main_grad
            expected = launch_gemm_scaled(a, b, Scaling.BLOCK, torch.float32, None, initial.clone(), None, cfg)
            got, expected = got - initial, expected - initial
        else:
            got = gemm_scaled(a, b, scaling=Scaling.BLOCK, out_dtype=torch.float32)
            expected = launch_gemm_scaled(a, b, Scaling.BLOCK, torch.float32, None, None, None, cfg)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3, msg=name)
        oracle = reference_gemm_scaled(a, b, scaling=Scaling.BLOCK, out_dtype=torch.float32)
        assert_close_rel(got, oracle, torch.float32, 100.0, what=name)
