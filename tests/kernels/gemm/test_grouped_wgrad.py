"""grouped_gemm_wgrad and grouped_bias_grad against their torch references.

On CPU the kernels run through Triton's interpreter; aligned 16-bit shapes take the ragged
TMA path, odd shapes and float32 the masked-pointer path.
"""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels.gemm.grouped import group_offsets
from fuseops.kernels.gemm.grouped_wgrad import (
    grouped_bias_grad,
    grouped_gemm_wgrad,
    launch_grouped_gemm_wgrad,
    pick_wgrad_config,
    reference_grouped_bias_grad,
    reference_grouped_gemm_wgrad,
)
from tests.helpers import DTYPES, assert_close_rel, groups_far_apart, poison_

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SPLITS = {
    "mixed": [5, 0, 40, 1, 33, 0],
    "one_holds_all": [0, 0, 71, 0],
    "single": [45],
}
# (N, K) of dw: 16-byte-aligned rows (TMA path for 16-bit dtypes) and odd ones.
SHAPES = {"aligned": (64, 48), "odd": (29, 37)}


def _case(split, shape, dtype):
    sizes = SPLITS[split]
    N, K = SHAPES[shape]
    M = sum(sizes)
    offsets = group_offsets(torch.tensor(sizes, device=DEVICE))
    dy = torch.randn(M, N, device=DEVICE, dtype=dtype)
    x = torch.randn(M, K, device=DEVICE, dtype=dtype)
    return sizes, offsets, dy, x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
def test_wgrad_matches_reference(dtype, split, shape):
    sizes, offsets, dy, x = _case(split, shape, dtype)
    N, K = SHAPES[shape]
    out = poison_(torch.empty(len(sizes), N, K, device=DEVICE, dtype=dtype))
    dw = grouped_gemm_wgrad(dy, x, offsets, out=out)
    assert dw.data_ptr() == out.data_ptr() and dw.dtype == dtype
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    assert_close_rel(dw, ref, dtype, what=f"dw {split} {shape}")
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.count_nonzero(dw[g]) == 0, f"empty group {g} is not exactly zero"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_wgrad_accumulates_into_main_grad(dtype, shape):
    sizes, offsets, dy, x = _case("mixed", shape, dtype)
    N, K = SHAPES[shape]
    main_grad = torch.randn(len(sizes), N, K, device=DEVICE, dtype=torch.float32)
    expected = main_grad.double() + reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    before = main_grad.clone()
    result = grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad)
    assert result.data_ptr() == main_grad.data_ptr() and result.dtype == torch.float32
    # The sum runs in float32 from operands of ``dtype``: its tolerance is the operands'.
    assert_close_rel(main_grad - before, expected - before.double(), dtype, what="increment")
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.equal(main_grad[g], before[g])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("given", ["out", "out_dtype"])
def test_float32_dw_from_16bit_operands_is_the_float32_sum(dtype, split, shape, given):
    """A float32 parameter's gradient under autocast: the kernel stores its float32 sums, not a
    16-bit rounding of them (~1.6e-3 off for bf16, ~2e-4 for fp16: float32's 1e-5 x 10 tells
    them apart, with room for the order of float32 additions on tensor cores)."""
    sizes, offsets, dy, x = _case(split, shape, dtype)
    N, K = SHAPES[shape]
    if given == "out":
        out = poison_(torch.empty(len(sizes), N, K, device=DEVICE, dtype=torch.float32))
        dw = grouped_gemm_wgrad(dy, x, offsets, out=out)
        assert dw.data_ptr() == out.data_ptr()
    else:
        dw = grouped_gemm_wgrad(dy, x, offsets, out_dtype=torch.float32)
    assert dw.dtype == torch.float32
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    assert_close_rel(dw, ref, dtype, what="within the 16-bit operands' tolerance")
    assert_close_rel(dw, ref, torch.float32, factor=10, what="not rounded to 16 bits")
    assert_close_rel(reference_grouped_gemm_wgrad(dy, x, offsets, out_dtype=torch.float32), ref, torch.float32,
                     factor=10, what="the reference")
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.count_nonzero(dw[g]) == 0, f"empty group {g} is not exactly zero"


def test_float32_dw_into_a_transposed_out():
    sizes, offsets, dy, x = _case("mixed", "aligned", torch.bfloat16)
    N, K = SHAPES["aligned"]
    buf = torch.zeros(len(sizes), K, N, device=DEVICE).transpose(1, 2)
    assert grouped_gemm_wgrad(dy, x, offsets, out=buf).data_ptr() == buf.data_ptr()
    assert_close_rel(buf, reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets), torch.float32, factor=10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
def test_bias_grad_matches_reference(dtype, split, shape):
    sizes, offsets, dy, _ = _case(split, shape, dtype)
    db = grouped_bias_grad(dy, offsets)
    assert db.shape == (len(sizes), SHAPES[shape][0]) and db.dtype == dtype
    assert_close_rel(db, reference_grouped_bias_grad(dy.double(), offsets), dtype, what="db")
    for g, size in enumerate(sizes):
        if size == 0:
            assert torch.count_nonzero(db[g]) == 0


@pytest.mark.parametrize("shape", SHAPES)
def test_both_walk_orders_write_the_same_sums(shape):
    """The Triton kernel walked along K first and along N first (gemm/wgrad_walk.py): every tile
    written (the poison is gone), with the same sums bit for bit."""
    sizes, offsets, dy, x = _case("mixed", shape, torch.bfloat16)
    N, K = SHAPES[shape]
    cfg = pick_wgrad_config(torch.bfloat16, shape == "aligned", False)
    dws = [launch_grouped_gemm_wgrad(dy, x, offsets, None, poison_(torch.empty(len(sizes), N, K, device=DEVICE,
                                                                               dtype=torch.bfloat16)), cfg, along_n)
           for along_n in (False, True)]
    assert_close_rel(dws[1], reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets), torch.bfloat16)
    assert torch.equal(dws[0], dws[1])


@pytest.mark.parametrize("n, k", [(16, 0), (0, 24)])
def test_wgrad_of_an_empty_dw(n, k):
    offsets = group_offsets(torch.tensor([3, 0, 5], device=DEVICE))
    dy = torch.randn(8, n, device=DEVICE, dtype=torch.bfloat16)
    x = torch.randn(8, k, device=DEVICE, dtype=torch.bfloat16)
    assert grouped_gemm_wgrad(dy, x, offsets).shape == (3, n, k)


def test_wgrad_all_groups_empty():
    offsets = group_offsets(torch.zeros(3, dtype=torch.int64, device=DEVICE))
    dy = torch.empty(0, 16, device=DEVICE, dtype=torch.bfloat16)
    x = torch.empty(0, 24, device=DEVICE, dtype=torch.bfloat16)
    dw = grouped_gemm_wgrad(dy, x, offsets, out=poison_(torch.empty(3, 16, 24, device=DEVICE, dtype=torch.bfloat16)))
    assert torch.count_nonzero(dw) == 0
    assert torch.count_nonzero(grouped_bias_grad(dy, offsets)) == 0


@pytest.mark.gpu
def test_gpu_wgrad_bf16_mid_size():
    g = torch.Generator().manual_seed(2)
    sizes = torch.randint(0, 900, (8,), generator=g)
    sizes[3] = 0
    offsets = group_offsets(sizes.cuda())
    M = int(sizes.sum())
    dy = torch.randn(M, 768, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M, 512, device="cuda", dtype=torch.bfloat16)
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    assert_close_rel(grouped_gemm_wgrad(dy, x, offsets), ref, torch.bfloat16)
    main_grad = torch.ones(8, 768, 512, device="cuda")
    grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad)
    assert_close_rel(main_grad - 1, ref, torch.bfloat16)
    dw32 = grouped_gemm_wgrad(dy, x, offsets, out_dtype=torch.float32)
    assert dw32.dtype == torch.float32
    assert_close_rel(dw32, ref, torch.float32, factor=10, what="float32 dw")
    assert_close_rel(grouped_bias_grad(dy, offsets), reference_grouped_bias_grad(dy.double(), offsets), torch.bfloat16)


@pytest.mark.parametrize("target", ["out", "main_grad"])
def test_wgrad_into_a_transposed_buffer(target):
    """A dw buffer whose last dim is strided (a transposed view) gets the same sums."""
    sizes, offsets, dy, x = _case("mixed", "aligned", torch.bfloat16)
    N, K = SHAPES["aligned"]
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets)
    dtype = torch.float32 if target == "main_grad" else torch.bfloat16
    buf = torch.zeros(len(sizes), K, N, device=DEVICE, dtype=dtype).transpose(1, 2)
    result = grouped_gemm_wgrad(dy, x, offsets, **{target: buf})
    assert result.data_ptr() == buf.data_ptr()
    assert_close_rel(buf, ref, torch.bfloat16, what=target)


@pytest.mark.parametrize("gathered", [False, True], ids=["rows", "gathered"])
@pytest.mark.parametrize("shape", SHAPES)
def test_main_grad_is_the_prior_plus_the_gradient_bit_for_bit(shape, gathered):
    """Into ``main_grad`` the finished float32 sum is added to the buffer, as ``main_grad.add_``
    of a float32 dw adds it: bit for bit, over several row slabs a group (a sum started from
    the buffer rounds differently, and two micro-batches were not twice one)."""
    sizes, offsets, dy, x = _case("mixed", shape, torch.bfloat16)
    x_rows = None
    if gathered:
        x_rows = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1)).to(DEVICE)
    N, K = SHAPES[shape]
    dw = grouped_gemm_wgrad(dy, x, offsets, out_dtype=torch.float32, x_rows=x_rows)
    prior = torch.randn(len(sizes), N, K, device=DEVICE)
    main_grad = prior.clone()
    grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad, x_rows=x_rows)
    assert torch.equal(main_grad, prior + dw)
    twice = torch.zeros_like(prior)
    for _ in range(2):
        grouped_gemm_wgrad(dy, x, offsets, main_grad=twice, x_rows=x_rows)
    assert torch.equal(twice, 2 * dw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("accumulate", [False, True], ids=["store", "main_grad"])
def test_wgrad_gathers_rows_of_x(dtype, split, shape, accumulate):
    """``x_rows``: the grouped rows of x are x[x_rows] (the MoE layer's permuted input, read
    from the unpermuted one), equal to the wgrad of the gathered copy; rows read repeatedly and
    rows never read both occur."""
    sizes, offsets, dy, _ = _case(split, shape, dtype)
    M, (N, K) = sum(sizes), SHAPES[shape]
    x = torch.randn(M // 2 + 3, K, device=DEVICE, dtype=dtype)
    x_rows = torch.randint(0, x.shape[0] - 1, (M,), generator=torch.Generator().manual_seed(M)).to(DEVICE)
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double().index_select(0, x_rows), offsets)
    if accumulate:
        main_grad = torch.randn(len(sizes), N, K, device=DEVICE)
        expected = main_grad.double() + ref
        got = grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad, x_rows=x_rows)
        assert_close_rel(got, expected, dtype, what=f"main_grad {split} {shape}")
        return
    got = grouped_gemm_wgrad(dy, x, offsets, out=poison_(torch.empty(len(sizes), N, K, device=DEVICE, dtype=dtype)),
                             x_rows=x_rows)
    assert_close_rel(got, ref, dtype, what=f"dw {split} {shape}")
    assert_close_rel(reference_grouped_gemm_wgrad(dy, x, offsets, x_rows=x_rows), ref, dtype, what="reference")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("shape", SHAPES)
def test_wgrad_gathers_rows_of_dy_and_x(dtype, split, shape):
    """``dy_rows`` (alone, and with ``x_rows``): the grouped rows of dy are dy[dy_rows] (FC2's
    weight gradient from the MoE layer's per-token output gradient), equal to the wgrad of the
    gathered copies, stored and added into a float32 main_grad."""
    sizes, offsets, _, x = _case(split, shape, dtype)
    M, (N, K) = sum(sizes), SHAPES[shape]
    dy = torch.randn(M // 2 + 3, N, device=DEVICE, dtype=dtype)
    gen = torch.Generator().manual_seed(M + 7)
    dy_rows = torch.randint(0, dy.shape[0] - 1, (M,), generator=gen).to(DEVICE)
    ref = reference_grouped_gemm_wgrad(dy.double().index_select(0, dy_rows), x.double(), offsets)
    got = grouped_gemm_wgrad(dy, x, offsets, dy_rows=dy_rows)
    assert_close_rel(got, ref, dtype, what=f"dw {split} {shape}")
    x_src = torch.randn(M // 3 + 2, K, device=DEVICE, dtype=dtype)
    x_rows = torch.randint(0, x_src.shape[0], (M,), generator=gen).to(DEVICE)
    both = reference_grouped_gemm_wgrad(dy.double().index_select(0, dy_rows), x_src.double().index_select(0, x_rows),
                                        offsets)
    main_grad = torch.randn(len(sizes), N, K, device=DEVICE)
    expected = main_grad.double() + both
    got = grouped_gemm_wgrad(dy, x_src, offsets, main_grad=main_grad, x_rows=x_rows, dy_rows=dy_rows)
    assert_close_rel(got, expected, dtype, what=f"main_grad {split} {shape}")
    assert_close_rel(reference_grouped_gemm_wgrad(dy, x, offsets, dy_rows=dy_rows), ref, dtype, what="reference")


@pytest.mark.parametrize("gathered", [False, True], ids=["rows", "gathered"])
def test_wgrad_into_groups_past_32_bit_offsets(gathered):
    """dw (and a float32 main_grad) whose last group starts past 2**31 elements, as the weight
    gradient of DeepSeek-V3's experts (256 x 4096 x 7168) does: each group's sum lands in
    its own group."""
    sizes, offsets, dy, x = _case("mixed", "aligned", torch.bfloat16)
    sizes, offsets = sizes[:3], offsets[:4]
    M, (N, K) = sum(sizes), SHAPES["aligned"]
    dy, x = dy[:M], x[:M]
    x_rows = torch.randperm(M, device=DEVICE) if gathered else None
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double(), offsets, x_rows=x_rows)
    out = groups_far_apart(3, N, K, torch.bfloat16, DEVICE)
    got = grouped_gemm_wgrad(dy, x, offsets, out=out, x_rows=x_rows)
    assert got.data_ptr() == out.data_ptr()
    assert_close_rel(got, ref, torch.bfloat16, what="dw")
    main_grad = groups_far_apart(3, N, K, torch.float32, DEVICE)
    expected = main_grad.double() + ref
    assert_close_rel(grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad, x_rows=x_rows), expected,
                     torch.bfloat16, what="main_grad")


@pytest.mark.gpu
def test_gpu_wgrad_gathered_rows_through_the_dispatch_table():
    """Gathered x on the GPU, as expert_layer's lean mode calls it: the dispatch table sends it
    to the Triton pointer path (on sm_90 past the Gluon row, which loads x by TMA)."""
    from fuseops.kernels import library

    g = torch.Generator().manual_seed(3)
    sizes = torch.randint(0, 700, (8,), generator=g)
    sizes[5] = 0
    offsets = group_offsets(sizes.cuda())
    M = int(sizes.sum())
    dy = torch.randn(M, 768, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(M // 3 + 1, 512, device="cuda", dtype=torch.bfloat16)
    x_rows = torch.randint(0, x.shape[0], (M,), generator=g).cuda()
    ref = reference_grouped_gemm_wgrad(dy.double(), x.double().index_select(0, x_rows), offsets)
    assert_close_rel(library.grouped_gemm_wgrad(dy, x, offsets, x_rows=x_rows), ref, torch.bfloat16)
    main_grad = torch.ones(8, 768, 512, device="cuda")
    library.grouped_gemm_wgrad(dy, x, offsets, main_grad=main_grad, x_rows=x_rows)
    assert_close_rel(main_grad - 1, ref, torch.bfloat16)
    # The upstream gradient's rows gathered too (lean's FC2 weight gradient).
    dy_src = torch.randn(M // 2 + 1, 768, device="cuda", dtype=torch.bfloat16)
    dy_rows = torch.randint(0, dy_src.shape[0], (M,), generator=g).cuda()
    ref = reference_grouped_gemm_wgrad(dy_src.double().index_select(0, dy_rows), x.double().index_select(0, x_rows),
                                       offsets)
    assert_close_rel(library.grouped_gemm_wgrad(dy_src, x, offsets, x_rows=x_rows, dy_rows=dy_rows), ref,
                     torch.bfloat16)


def test_gathered_operand_picks_its_tile(monkeypatch):
    """The table has a tile per gathered operand (x: FC1's weight gradient, dy: FC2's, or both):
    grouped_gemm_wgrad hands the launcher the entry of the operand it gathers."""
    from fuseops.kernels.gemm import grouped_wgrad

    table = {name: grouped_wgrad.GemmConfig(16, 16, 16 * (i + 1), 1, 4, 1)
             for i, name in enumerate(("store", "accumulate", "pointer", "gathered x", "gathered dy", "fp32", "tf32"))}
    monkeypatch.setattr(grouped_wgrad, "_configs", lambda: table)
    picked = []
    monkeypatch.setattr(grouped_wgrad, "launch_grouped_gemm_wgrad", lambda *args, **kw: picked.append(args[5]))
    offsets = group_offsets(torch.tensor([3, 5], device=DEVICE))
    dy, x = torch.randn(8, 16, device=DEVICE, dtype=torch.bfloat16), torch.randn(8, 16, device=DEVICE, dtype=torch.bfloat16)
    rows = torch.arange(8, device=DEVICE)
    for kw in ({"x_rows": rows}, {"dy_rows": rows}, {"x_rows": rows, "dy_rows": rows}):
        grouped_gemm_wgrad(dy, x, offsets, **kw)
    assert picked == [table["gathered x"], table["gathered dy"], table["gathered dy"]]
    with pytest.raises(ValueError, match="gathered='rows'"):
        pick_wgrad_config(torch.bfloat16, False, False, "rows")
