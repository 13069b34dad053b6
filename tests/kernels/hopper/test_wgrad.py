"""The warp-specialized 16-bit grouped wgrad (Gluon, sm_90) against float64 and, element by
element, against the Triton kernel it replaces: ragged groups (empty, shorter than a step,
across step edges, one holding everything, many), N and K tails, bf16 and fp16, written to
``dw`` / ``out`` (also a strided one; in the operands' dtype or float32) or added to
``main_grad``, and CUDA-graph replay with new routing. GPU only: Gluon does not run in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.dispatch import Kernel
from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_wgrad import (
    launch_grouped_gemm_wgrad,
    pick_wgrad_config,
    reference_grouped_gemm_wgrad,
)
from fuseops.kernels.hopper import wgrad as hopper
from tests.helpers import HOPPER_SPLITS, SM90_ONLY, assert_close_rel, dispatched, poison_

# The launchers as ops reach them: through the dispatch table (the Gluon kernels on sm_90).
grouped_gemm_wgrad = dispatched(Kernel.GROUPED_GEMM_WGRAD)

pytestmark = SM90_ONLY

SPLITS = HOPPER_SPLITS
# (N, K) of dw: multiples of the [128, 256] tile, and tails of both (16-byte rows for TMA).
SHAPES = {"even": (256, 512), "tails": (200, 264)}


def _case(split: str, shape: str, dtype: torch.dtype):
    sizes = SPLITS[split]
    N, K = SHAPES[shape]
    offsets = group_offsets(torch.tensor(sizes, device="cuda"))
    dy = torch.randn(sum(sizes), N, device="cuda", dtype=dtype)
    x = torch.randn(sum(sizes), K, device="cuda", dtype=dtype)
    return sizes, offsets, dy, x


def _triton(dy, x, offsets, main_grad=None, out_dtype=None):
    cfg = pick_wgrad_config(x.dtype, True, main_grad is not None or out_dtype == torch.float32)
    return launch_grouped_gemm_wgrad(dy, x, offsets, main_grad, None, cfg, out_dtype=out_dtype)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wgrad(split, shape, dtype):
    sizes, offsets, dy, x = _case(split, shape, dtype)
    N, K = SHAPES[shape]
    out = poison_(torch.empty(len(sizes), N, K, device="cuda", dtype=dtype))
    assert hopper.usable(dy, x, None, out)
    dw = grouped_gemm_wgrad(dy, x, offsets, out=out)
    assert dw is out
    # Every element written (the poison is gone), none beyond tolerance; empty groups exactly 0.
    assert_close_rel(dw, reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets), dtype, what=f"{split} {shape}")
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.count_nonzero(dw[g]) == 0, f"empty group {g}"
    torch.testing.assert_close(dw, _triton(dy, x, offsets), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wgrad_float32_dw(split, shape, dtype):
    """A float32 parameter's gradient under autocast: the float32 sums stored by TMA as they
    are. Every element written (the poison is gone), within float32's tolerance x 10 of float64
    (a 16-bit rounding would be ~1.6e-3 off for bf16, ~2e-4 for fp16), empty groups exactly 0,
    the Triton kernel's float32 sums, and the same dw when allocated from ``out_dtype``."""
    sizes, offsets, dy, x = _case(split, shape, dtype)
    N, K = SHAPES[shape]
    out = poison_(torch.empty(len(sizes), N, K, device="cuda", dtype=torch.float32))
    assert hopper.usable(dy, x, None, out) and hopper.usable(dy, x, None, None, torch.float32)
    dw = grouped_gemm_wgrad(dy, x, offsets, out=out)
    assert dw is out
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    assert_close_rel(dw, ref, dtype, what=f"{split} {shape}")
    assert_close_rel(dw, ref, torch.float32, factor=10, what=f"{split} {shape}: not rounded to 16 bits")
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.count_nonzero(dw[g]) == 0, f"empty group {g}"
    torch.testing.assert_close(dw, _triton(dy, x, offsets, out_dtype=torch.float32), rtol=1e-5, atol=1e-4)
    allocated = grouped_gemm_wgrad(dy, x, offsets, out_dtype=torch.float32)
    assert allocated.dtype == torch.float32 and torch.equal(allocated, dw)


@pytest.mark.parametrize("accumulate", [False, True])
def test_both_walk_orders_write_the_same_sums(accumulate):
    """Walked along K first and along N first (gemm/wgrad_walk.py), over ragged groups and tails:
    every tile written, the same sums bit for bit."""
    sizes, offsets, dy, x = _case("ragged", "tails", torch.bfloat16)
    N, K = SHAPES["tails"]
    start = torch.randn(len(sizes), N, K, device="cuda")
    dws, dws32 = [], []
    for along_n in (False, True):
        if accumulate:
            dws.append(hopper.grouped_wgrad_hopper(dy, x, offsets, main_grad=start.clone(), along_n=along_n))
        else:
            out = poison_(torch.empty(len(sizes), N, K, device="cuda", dtype=torch.bfloat16))
            dws.append(hopper.grouped_wgrad_hopper(dy, x, offsets, out=out, along_n=along_n))
            out32 = poison_(torch.empty(len(sizes), N, K, device="cuda"))
            dws32.append(hopper.grouped_wgrad_hopper(dy, x, offsets, out=out32, along_n=along_n))
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    assert_close_rel(dws[1] - start if accumulate else dws[1], ref, torch.bfloat16)
    assert torch.equal(dws[0], dws[1])
    if not accumulate:
        assert_close_rel(dws32[1], ref, torch.float32, factor=10)
        assert torch.equal(dws32[0], dws32[1])


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
def test_wgrad_into_main_grad(split, shape):
    sizes, offsets, dy, x = _case(split, shape, torch.bfloat16)
    N, K = SHAPES[shape]
    main_grad = torch.randn(len(sizes), N, K, device="cuda")
    before = main_grad.clone()
    assert hopper.usable(dy, x, main_grad, None)
    result = grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad)
    assert result is main_grad
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    # The sum runs in float32 from bf16 operands: its tolerance is bf16's.
    assert_close_rel(main_grad - before, ref, torch.bfloat16, what=f"{split} {shape}")
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.equal(main_grad[g], before[g]), f"empty group {g} changed"
    torch.testing.assert_close(main_grad, _triton(dy, x, offsets, before.clone()), rtol=1e-5, atol=1e-4)


def test_into_a_strided_out():
    """``out`` a view with padded rows: TMA writes it in place, the padding stays untouched."""
    sizes, offsets, dy, x = _case("ragged", "tails", torch.bfloat16)
    N, K = SHAPES["tails"]
    padded = torch.zeros(len(sizes), N, K + 8, device="cuda", dtype=torch.bfloat16)
    out = padded[:, :, :K]
    assert hopper.usable(dy, x, None, out)
    grouped_gemm_wgrad(dy, x, offsets, out=out)
    assert_close_rel(out, reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets), torch.bfloat16)
    assert torch.count_nonzero(padded[:, :, K:]) == 0


def test_allocates_dw_in_the_operands_dtype():
    sizes, offsets, dy, x = _case("ragged", "even", torch.bfloat16)
    dw = grouped_gemm_wgrad(dy, x, offsets)
    assert dw.shape == (len(sizes), *SHAPES["even"]) and dw.dtype == torch.bfloat16
    assert_close_rel(dw, reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets), torch.bfloat16)


def test_other_cases_take_the_triton_kernel():
    """float32 operands, a transposed ``out`` or ``main_grad`` and rows without 16-byte
    alignment stay on the Triton kernel, and still give the right sums."""
    sizes, offsets, dy, x = _case("ragged", "even", torch.bfloat16)
    G, (N, K) = len(sizes), SHAPES["even"]
    main_grad_t = torch.ones(G, K, N, device="cuda").transpose(1, 2)
    strided = torch.empty(G, K, N, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    strided32 = torch.empty(G, K, N, device="cuda").transpose(1, 2)
    odd_x = torch.randn(x.shape[0], 260, device="cuda", dtype=torch.bfloat16)[:, :259]
    assert not hopper.usable(dy, x, main_grad_t, None)
    assert not hopper.usable(dy.float(), x.float(), None, None)
    assert not hopper.usable(dy, x, None, strided)
    assert not hopper.usable(dy, x, None, strided32)
    assert not hopper.usable(dy, x, None, None, torch.float64)
    assert not hopper.usable(dy, odd_x, None, None)
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    assert_close_rel(grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad_t) - 1, ref, torch.bfloat16)
    assert_close_rel(grouped_gemm_wgrad(dy, x, offsets, out=strided), ref, torch.bfloat16)
    assert_close_rel(grouped_gemm_wgrad(dy, x, offsets, out=strided32), ref, torch.float32, factor=10)
    odd_ref = reference_grouped_gemm_wgrad(dy.double(), odd_x.double(), offsets)
    assert_close_rel(grouped_gemm_wgrad(dy, odd_x, offsets), odd_ref, torch.bfloat16)


def test_captures_in_a_cuda_graph():
    """No host sync: the wgrad replays in a CUDA graph with new split sizes."""
    sizes, offsets, dy, x = _case("ragged", "even", torch.bfloat16)
    eager = grouped_gemm_wgrad(dy, x, offsets)
    main_grad = torch.zeros(eager.shape, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = grouped_gemm_wgrad(dy, x, offsets)
        captured32 = grouped_gemm_wgrad(dy, x, offsets, out_dtype=torch.float32)
        grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad)
    # Move every token of group 0 to group 2: the same total rows, other groups' sums.
    offsets.copy_(group_offsets(torch.tensor([0, 0, 301] + sizes[3:], device="cuda")))
    main_grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, grouped_gemm_wgrad(dy, x, offsets))
    assert torch.equal(captured32, grouped_gemm_wgrad(dy, x, offsets, out_dtype=torch.float32))
    assert not torch.equal(captured, eager)
    assert torch.equal(main_grad, grouped_gemm_wgrad(dy, x, offsets, main_grad=torch.zeros_like(main_grad)))
