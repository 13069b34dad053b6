"""grouped_gemm (forward and dgrad) and group_offsets against their torch references.

On CPU the kernels run through Triton's interpreter; aligned 16-bit shapes take the TMA path,
odd shapes and float32 the masked-pointer path.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm.grouped import (
    group_offsets,
    grouped_gemm,
    launch_grouped_gemm,
    persistent_programs,
    pick_config,
    reference_group_offsets,
    reference_grouped_gemm,
)
from fuseops.kernels.gemm.grouped_wgrad import grouped_bias_grad, grouped_gemm_wgrad
from tests.helpers import DTYPES, assert_close_rel, capture_cuda_graph, groups_far_apart, poison_

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Split sizes that stress the tile walk: empty groups (first, middle, last), one group holding
# every row, a single group, sizes below and across tile multiples, a group of 9 M-tiles
# (uneven swizzle bands under the interpreter's 32-row tiles).
SPLITS = {
    "mixed": [5, 0, 40, 1, 33, 0],
    "one_holds_all": [0, 0, 71, 0],
    "tall": [0, 270, 7],
    "single": [45],
    "empty_ends": [0, 17, 64, 0],
}
# (K, N): 16-byte-aligned rows (TMA path for 16-bit dtypes) and odd ones (masked pointers).
SHAPES = {"aligned": (48, 64), "odd": (37, 29)}


def _offsets(sizes: list[int]) -> torch.Tensor:
    return group_offsets(torch.tensor(sizes, device=DEVICE))


def _weight_view(G: int, K: int, N: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """b [G, K, N] as the forward sees it (a transposed [G, N, K] weight) or as dgrad does."""
    if layout == "forward":
        return torch.randn(G, N, K, device=DEVICE, dtype=dtype).transpose(1, 2)
    return torch.randn(G, K, N, device=DEVICE, dtype=dtype)


def _reference(a, b, offsets, **kw):
    """The float64 reference; float64 copies of the tensor keyword arguments."""
    kw = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    return reference_grouped_gemm(a.double(), b.double(), offsets, **kw)


@pytest.mark.parametrize("int_dtype", [torch.int32, torch.int64])
def test_group_offsets(int_dtype):
    sizes = torch.tensor([3, 0, 7, 0, 0, 12], dtype=int_dtype, device=DEVICE)
    offsets = group_offsets(sizes)
    assert offsets.dtype == torch.int64 and offsets.device == sizes.device
    assert offsets.tolist() == [0, 3, 3, 10, 10, 10, 22]
    assert torch.equal(offsets, reference_group_offsets(sizes))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["forward", "dgrad"])
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
def test_grouped_gemm_matches_reference(dtype, layout, split, shape):
    sizes = SPLITS[split]
    K, N = SHAPES[shape]
    G, M = len(sizes), sum(sizes)
    offsets = _offsets(sizes)
    a = torch.randn(M, K, device=DEVICE, dtype=dtype)
    b = _weight_view(G, K, N, dtype, layout)
    y, preact = grouped_gemm(a, b, offsets, out=poison_(torch.empty(M, N, device=DEVICE, dtype=dtype)))
    assert preact is None
    assert_close_rel(y, _reference(a, b, offsets)[0], dtype, what=f"y {split} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act", [Activation.GELU_TANH, Activation.SILU])
def test_forward_epilogue_bias_act_row_scale(dtype, shape, act):
    sizes = SPLITS["mixed"]
    K, N = SHAPES[shape]
    G, M = len(sizes), sum(sizes)
    offsets = _offsets(sizes)
    a = torch.randn(M, K, device=DEVICE, dtype=dtype)
    b = _weight_view(G, K, N, dtype, "forward")
    kw = dict(
        bias=torch.randn(G, N, device=DEVICE, dtype=dtype),
        row_scale=torch.rand(M, device=DEVICE, dtype=torch.float32),
        act=act,
        alpha=1.702 if act == Activation.SILU else 1.0,
        save_preact=True,
    )
    y, preact = grouped_gemm(a, b, offsets, out=poison_(torch.empty(M, N, device=DEVICE, dtype=dtype)), **kw)
    y_ref, preact_ref = _reference(a, b, offsets, **kw)
    assert_close_rel(y, y_ref, dtype, what="y")
    # Empty groups and rows past a group's end must not be written with garbage.
    assert_close_rel(preact, preact_ref, dtype, what="preact")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act", [Activation.GELU, Activation.SRELU])
def test_dgrad_epilogue_act_grad(dtype, shape, act):
    """dgrad through the activation before this GEMM: ``(dy @ W[g]) * act'(z)``, row-scaled."""
    sizes = SPLITS["empty_ends"]
    K, N = SHAPES[shape]
    G, M = len(sizes), sum(sizes)
    offsets = _offsets(sizes)
    dy = torch.randn(M, K, device=DEVICE, dtype=dtype)
    w = _weight_view(G, K, N, dtype, "dgrad")
    kw = dict(
        act=act,
        act_grad_input=torch.randn(M, N, device=DEVICE, dtype=dtype),
        row_scale=torch.rand(M, device=DEVICE, dtype=dtype),
    )
    y, _ = grouped_gemm(dy, w, offsets, out=poison_(torch.empty(M, N, device=DEVICE, dtype=dtype)), **kw)
    assert_close_rel(y, _reference(dy, w, offsets, **kw)[0], dtype, what="dx")


@settings(max_examples=12)
@given(
    sizes=st.lists(st.integers(0, 50), min_size=1, max_size=6),
    layout=st.sampled_from(["forward", "dgrad"]),
    dtype=st.sampled_from([torch.float16, torch.bfloat16]),
)
def test_grouped_gemm_random_splits(sizes, layout, dtype):
    K, N = SHAPES["aligned"]
    G, M = len(sizes), sum(sizes)
    offsets = _offsets(sizes)
    a = torch.randn(M, K, device=DEVICE, dtype=dtype)
    b = _weight_view(G, K, N, dtype, layout)
    y, _ = grouped_gemm(a, b, offsets, out=poison_(torch.empty(M, N, device=DEVICE, dtype=dtype)))
    if M:
        assert_close_rel(y, _reference(a, b, offsets)[0], dtype, what=f"sizes {sizes}")


def test_more_programs_per_sm_give_the_same_bits():
    """The persistent walk with several programs per SM (each takes every P-th tile) covers
    every tile once: bit-identical to one program per SM, which the table uses."""
    a = torch.randn(sum(SPLITS["tall"]), 48, device=DEVICE, dtype=torch.float32)
    b = _weight_view(3, 48, 64, torch.float32, "forward")
    offsets = _offsets(SPLITS["tall"])
    cfg = pick_config(64, a.dtype, False, False)
    outs = []
    for per_sm in (1, 3):
        cfg_p = dataclasses.replace(cfg, programs_per_sm=per_sm)
        assert persistent_programs(a, 10**6, per_sm) == per_sm * persistent_programs(a, 10**6)
        outs.append(launch_grouped_gemm(a, b, offsets, None, None, Activation.IDENTITY, 1.0, False, None, None, cfg_p)[0])
    assert torch.equal(outs[0], outs[1])
    assert_close_rel(outs[0], _reference(a, b, offsets)[0], torch.float32)


def _moe_case(dtype=torch.bfloat16, G=8, K=512, N=768, seed=1):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(0, 700, (G,), generator=g)
    sizes[1] = 0
    offsets = group_offsets(sizes.cuda())
    M = int(sizes.sum())
    x = torch.randn(M, K, device="cuda", dtype=dtype)
    w = torch.randn(G, N, K, device="cuda", dtype=dtype) / K**0.5
    return sizes, offsets, x, w


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", ["mixed", "tall", "empty_ends"])
@pytest.mark.parametrize("shape", SHAPES)
def test_grouped_gemm_gathers_rows_of_a(dtype, split, shape):
    """``a_rows``: grouped row i is ``a[a_rows[i]]``, equal to the GEMM of the gathered copy
    (with bias and the pre-activation saved: the MoE layer's lean recompute of FC1)."""
    K, N = SHAPES[shape]
    sizes = SPLITS[split]
    M, G = sum(sizes), len(sizes)
    offsets = _offsets(sizes)
    a = torch.randn(M // 2 + 3, K, device=DEVICE, dtype=dtype)
    a_rows = torch.randint(0, a.shape[0] - 1, (M,), generator=torch.Generator().manual_seed(M)).to(DEVICE)
    b = _weight_view(G, K, N, dtype, "forward")
    bias = torch.randn(G, N, device=DEVICE, dtype=dtype)
    y, z = grouped_gemm(a, b, offsets, bias=bias, act=Activation.GELU, save_preact=True, a_rows=a_rows,
                        out=poison_(torch.empty(M, N, device=DEVICE, dtype=dtype)))
    y_ref, z_ref = _reference(a.index_select(0, a_rows), b, offsets, bias=bias, act=Activation.GELU,
                              save_preact=True)
    assert_close_rel(y, y_ref, dtype, what=f"y {split} {shape}")
    assert_close_rel(z, z_ref, dtype, what=f"preact {split} {shape}")
    y_gathered_ref, _ = reference_grouped_gemm(a, b, offsets, bias=bias, act=Activation.GELU, a_rows=a_rows)
    assert_close_rel(y_gathered_ref, y_ref, dtype, what="reference")


def test_gathered_rows_times_weights_past_32_bit_offsets():
    """A weight [G, K, N] whose last group starts past 2**31 elements (DeepSeek-V3's FC1 is
    256 x 7168 x 4096), read through the pointer loads a gathered ``a`` takes: each group's
    rows meet their own group's weight."""
    sizes = [5, 9, 7]
    offsets = _offsets(sizes)
    M, (K, N) = sum(sizes), SHAPES["aligned"]
    a = torch.randn(M, K, device=DEVICE, dtype=torch.bfloat16)
    a_rows = torch.randperm(M, device=DEVICE)
    b = groups_far_apart(3, K, N, torch.bfloat16, DEVICE)
    y, _ = grouped_gemm(a, b, offsets, a_rows=a_rows)
    y_ref, _ = _reference(a.index_select(0, a_rows), b, offsets)
    assert_close_rel(y, y_ref, torch.bfloat16, what="y")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["forward", "dgrad"])
def test_gpu_bf16_mid_size(layout):
    sizes, offsets, x, w = _moe_case()
    M, K = x.shape
    b = w.transpose(1, 2) if layout == "forward" else w
    a = x if layout == "forward" else torch.randn(M, w.shape[1], device="cuda", dtype=x.dtype)
    bias = torch.randn(w.shape[0], b.shape[2], device="cuda", dtype=x.dtype)
    y, _ = grouped_gemm(a, b, offsets, bias=bias)
    assert_close_rel(y, _reference(a, b, offsets, bias=bias)[0], torch.bfloat16)


@pytest.mark.gpu
def test_gpu_gathered_rows_bf16_mid_size():
    """The forward reading x's rows through a row map (the lean expert layer's recompute of FC1)."""
    sizes, offsets, x, w = _moe_case()
    M = x.shape[0]
    src = torch.randn(M // 3 + 1, x.shape[1], device="cuda", dtype=x.dtype)
    rows = torch.randint(0, src.shape[0], (M,), generator=torch.Generator().manual_seed(2)).cuda()
    bias = torch.randn(w.shape[0], w.shape[1], device="cuda", dtype=x.dtype)
    y, _ = grouped_gemm(src, w.transpose(1, 2), offsets, bias=bias, a_rows=rows)
    assert_close_rel(y, _reference(src.index_select(0, rows), w.transpose(1, 2), offsets, bias=bias)[0],
                     torch.bfloat16)


@pytest.mark.gpu
def test_gpu_no_host_sync():
    sizes, offsets, x, w = _moe_case()
    dy = torch.randn(x.shape[0], w.shape[1], device="cuda", dtype=x.dtype)
    split_sizes = sizes.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        offsets = group_offsets(split_sizes)
        y, _ = grouped_gemm(x, w.transpose(1, 2), offsets, act=Activation.SILU, save_preact=True)
        grouped_gemm(dy, w, offsets)
        grouped_gemm_wgrad(dy, x, offsets)
        grouped_gemm_wgrad(dy, x, offsets, main_grad=torch.zeros(w.shape, device="cuda"))
        grouped_bias_grad(dy, offsets)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_with_new_split_sizes():
    _, _, x, w = _moe_case()
    M, G = x.shape[0], w.shape[0]
    dy = torch.randn(M, w.shape[1], device="cuda", dtype=x.dtype)
    split_sizes = torch.zeros(G, dtype=torch.int64, device="cuda")
    split_sizes[0] = M

    def step():
        offsets = group_offsets(split_sizes)
        y, _ = grouped_gemm(x, w.transpose(1, 2), offsets)
        return y, grouped_gemm_wgrad(dy, x, offsets)

    graph, (y_static, dw_static) = capture_cuda_graph(step, warmup=1)
    for new in ([M // 2, 0, M - M // 2 - 7, 7, 0, 0, 0, 0], [0] * (G - 1) + [M]):
        split_sizes.copy_(torch.tensor(new))
        graph.replay()
        y_eager, dw_eager = step()
        torch.cuda.synchronize()
        assert torch.equal(y_static, y_eager)
        assert torch.equal(dw_static, dw_eager)
