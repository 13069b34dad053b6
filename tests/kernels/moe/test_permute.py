import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseops.kernels.moe import permute as kernels
from fuseops.moe.expert_layer_steps import token_of_rows
from tests.helpers import DTYPES, assert_close_rel, cuda_or_skip, poison_

INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
# (T, H, E, K): one token, one feature, top-1, E not a power of two and wider than the
# scan tile, T*K over several 16-entry routing blocks, T and H not multiples of the copy tile.
SHAPES = [(1, 1, 1, 1), (1, 8, 4, 2), (37, 70, 5, 3), (64, 33, 8, 1), (50, 40, 130, 2), (0, 8, 3, 2)]


def loop_permute(x: torch.Tensor, expert_ids: torch.Tensor, num_experts: int):
    """The routing spelled out in float64: experts ascending, then (token, choice) order.
    Differentiable in ``x`` (rows are stacked float64 views)."""
    T, K = expert_ids.shape
    ids = expert_ids.tolist()
    rows, sizes = [], [0] * num_experts
    row_map = torch.empty(T, K, dtype=torch.int64)
    for e in range(num_experts):
        for t in range(T):
            for k in range(K):
                if ids[t][k] == e:
                    row_map[t, k] = len(rows)
                    rows.append(x[t].double())
                    sizes[e] += 1
    # Slices keep empty results in the autograd graph.
    x_sorted = torch.stack(rows) if rows else x.double()[:0]
    return x_sorted, torch.tensor(sizes, dtype=torch.int64), row_map


def loop_unpermute(y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor | None):
    """``y[t] = sum_k w[t, k] * y_sorted[row_map[t, k]]`` one token at a time, float64."""
    T, K = row_map.shape
    y = []
    for t in range(T):
        acc = y_sorted.new_zeros(y_sorted.shape[1], dtype=torch.float64)
        for k in range(K):
            w = 1.0 if weights is None else weights[t, k].double()
            acc = acc + w * y_sorted[int(row_map[t, k])].double()
        y.append(acc)
    return torch.stack(y) if y else y_sorted.double()[:0]


def routing(T: int, E: int, K: int, dtype=torch.int64, device="cpu") -> torch.Tensor:
    """K distinct experts per token where E allows, else repeats (both are legal)."""
    if K <= E:
        return torch.rand(T, E, device=device).topk(K, dim=1).indices.to(dtype)
    return torch.randint(0, E, (T, K), device=device).to(dtype)


def _check_permute(x, ids, E):
    n = ids.numel()
    out = poison_(torch.empty(n, x.shape[1], dtype=x.dtype, device=x.device))
    x_sorted, split_sizes, row_map = kernels.permute(x, ids, E, out=out)
    ref_sorted, ref_sizes, ref_map = loop_permute(x.cpu(), ids.cpu(), E)
    assert x_sorted.data_ptr() == out.data_ptr()
    assert split_sizes.dtype == torch.int64 and row_map.dtype == torch.int64
    assert torch.equal(row_map.cpu(), ref_map)
    assert torch.equal(split_sizes.cpu(), ref_sizes)
    # A permutation copies rows: bitwise equal in every dtype.
    assert torch.equal(x_sorted.cpu().double(), ref_sorted)
    return x_sorted, row_map


def _check_unpermute(y_sorted, row_map, weights, dtype):
    T = row_map.shape[0]
    y = kernels.unpermute(y_sorted, row_map, weights, out=poison_(torch.empty(T, y_sorted.shape[1], dtype=dtype)))
    assert y.dtype == dtype
    assert_close_rel(y, loop_unpermute(y_sorted, row_map, weights), dtype, what="y")
    dy = torch.randn(T, y_sorted.shape[1]).to(dtype)
    dy_sorted, dw = kernels.unpermute_bwd(dy, row_map, weights, y_sorted, out=poison_(torch.empty_like(y_sorted)))
    w64 = None if weights is None else weights.double()
    ref_sorted, ref_dw = kernels.reference_unpermute_bwd(dy.double(), row_map, w64, y_sorted.double())
    assert_close_rel(dy_sorted, ref_sorted, dtype, what="dy_sorted")
    assert dw.dtype == (weights.dtype if weights is not None else dtype)
    assert_close_rel(dw, ref_dw, dtype, what="dweights")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_launchers_match_loop(shape, dtype):
    T, H, E, K = shape
    x = torch.randn(T, H).to(dtype)
    x_sorted, row_map = _check_permute(x, routing(T, E, K), E)
    _check_unpermute(torch.randn(T * K, H).to(dtype), row_map, torch.rand(T, K), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weights", ["data_dtype", "none"])
def test_weights_in_data_dtype_or_none(weights, dtype):
    T, H, E, K = 21, 40, 6, 3
    _, row_map = _check_permute(torch.randn(T, H).to(dtype), routing(T, E, K), E)
    w = torch.rand(T, K).to(dtype) if weights == "data_dtype" else None
    _check_unpermute(torch.randn(T * K, H).to(dtype), row_map, w, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("columns", [(0, 24), (24, 61), (61, 70)], ids=str)
def test_unpermute_bwd_reads_a_column_slice_in_place(columns, dtype):
    # The expert layer's backward copies x's rows in column slices: x[:, start:stop], rows
    # 70 elements apart, never made contiguous.
    T, H, E, K = 37, 70, 5, 3
    start, stop = columns
    x, ids = torch.randn(T, H).to(dtype), routing(T, E, K)
    _, row_map = _check_permute(x, ids, E)
    part = x[:, start:stop]
    assert not part.is_contiguous()
    # permute itself takes the slice in place, and a column-major copy of it.
    for layout in (part, part.t().contiguous().t()):
        assert torch.equal(kernels.permute(layout, ids, E)[0], x[:, start:stop].contiguous()[token_of_rows(row_map)])
    weights = torch.rand(T, K)
    for w in (None, weights):
        got, _ = kernels.unpermute_bwd(part, row_map, w, None,
                                       out=poison_(torch.empty(T * K, stop - start, dtype=dtype)))
        # The same bits as from a contiguous copy of the slice, and the reference's values
        # (a column-major copy of the slice too, which the launcher makes row-major).
        assert torch.equal(got, kernels.unpermute_bwd(part.contiguous(), row_map, w, None)[0])
        assert torch.equal(got, kernels.unpermute_bwd(part.t().contiguous().t(), row_map, w, None)[0])
        want, _ = kernels.reference_unpermute_bwd(part.double(), row_map, None if w is None else w.double(), None)
        assert_close_rel(got, want, dtype, what="dy_sorted")
        if w is None:  # a copy is exact
            assert torch.equal(got.double(), want)


@pytest.mark.parametrize("id_dtype", INT_DTYPES)
def test_any_integer_ids(id_dtype):
    _check_permute(torch.randn(29, 16), routing(29, 6, 2, id_dtype), 6)


@pytest.mark.parametrize(
    "case", ["all_to_one", "empty_experts", "same_expert_twice", "last_expert"]
)
def test_skewed_routing(case):
    T, K, E = 45, 3, 16
    if case == "all_to_one":
        ids = torch.full((T, K), 2)
    elif case == "empty_experts":
        ids = torch.tensor([3, 7])[torch.randint(0, 2, (T, K))]
    elif case == "same_expert_twice":
        ids = torch.randint(0, 2, (T, K))
    else:
        ids = torch.full((T, K), E - 1)
    x_sorted, row_map = _check_permute(torch.randn(T, 24), ids, E)
    if case in ("all_to_one", "last_expert"):
        # One expert: stability means flat (token, choice) order is kept exactly.
        assert torch.equal(row_map, torch.arange(T * K).view(T, K))
    _check_unpermute(x_sorted, row_map, torch.rand(T, K), torch.float32)


@pytest.mark.parametrize("shape", [(37, 70, 5, 3), (0, 8, 3, 2)])
def test_no_columns_route_alone(shape):
    """A [T, 0] x routes without copying (the quantized expert layer's routing): the same split
    sizes and row map as the full x, the kernel and the reference alike."""
    T, H, E, K = shape
    x = torch.randn(T, H)
    ids = torch.randint(0, E, (T, K))
    full = kernels.permute(x, ids, E)
    for impl in (kernels.permute, kernels.reference_permute):
        x_sorted, split_sizes, row_map = impl(x[:, :0], ids, E)
        assert x_sorted.shape == (T * K, 0)
        assert torch.equal(split_sizes, full[1]) and torch.equal(row_map, full[2])


def test_out_of_range_ids_are_clamped_like_the_reference():
    ids = torch.tensor([[-3, 1], [9, 0], [2, 2]])
    x = torch.randn(3, 8)
    got = kernels.permute(x, ids, 3)
    ref = kernels.reference_permute(x, ids, 3)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    assert sorted(got[1].tolist()) == [1, 2, 3] and int(got[1].sum()) == 6


def _ids_with(bad_value: int, at: int, T: int = 40, K: int = 2, E: int = 3) -> torch.Tensor:
    ids = routing(T, E, K)
    ids.view(-1)[at] = bad_value
    return ids


# (ids, whether all lie in [0, 3)): a bad id in the first or a later 16-entry routing block,
# below or above the range, and an int64 id that an int32 cast would wrap into range.
RANGE_CASES = [
    (lambda: routing(40, 3, 2), True),
    (lambda: _ids_with(-1, 0), False),
    (lambda: _ids_with(3, 70), False),
    (lambda: _ids_with(2**32 + 1, 33), False),
]


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("case", range(len(RANGE_CASES)))
def test_permute_flags_out_of_range_ids(impl, case):
    make_ids, in_range = RANGE_CASES[case]
    ids, x = make_ids(), torch.randn(40, 8)
    run = kernels.permute if impl == "kernel" else kernels.reference_permute
    flag = torch.ones(1, dtype=torch.int32)
    got = run(x, ids, 3, ids_ok=flag)
    assert int(flag) == int(in_range)
    # The flag changes nothing else.
    for a, b in zip(got, kernels.reference_permute(x, ids, 3)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("bad", [None, -1, 40, 2**40])
def test_unpermute_flags_out_of_range_rows_and_reads_in_bounds(impl, bad):
    T, K, H = 20, 2, 8
    y_sorted, row_map = torch.randn(T * K, H), torch.randperm(T * K).view(T, K)
    if bad is not None:
        row_map[13, 1] = bad
    run = kernels.unpermute if impl == "kernel" else kernels.reference_unpermute
    flag = torch.ones(1, dtype=torch.int32)
    y = run(y_sorted, row_map, None, rows_ok=flag)
    assert int(flag) == int(bad is None)
    # Bad rows read a clamped row (never out of bounds) until the caller's assert reports.
    clamped = row_map.clamp(0, T * K - 1)
    assert_close_rel(y, loop_unpermute(y_sorted, clamped, None), torch.float32)


@settings(max_examples=15)
@given(
    T=st.integers(0, 40), K=st.integers(1, 4), E=st.integers(1, 20), H=st.integers(1, 40), seed=st.integers(0, 2**16)
)
def test_routing_property(T, K, E, H, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, E, (T, K), generator=g)
    x = torch.randn(T, H, generator=g)
    x_sorted, split_sizes, row_map = kernels.permute(x, ids, E)
    # row_map is a permutation, rows follow experts, and unpermute undoes permute.
    assert torch.equal(row_map.flatten().sort().values, torch.arange(T * K))
    experts_by_row = ids.flatten()[row_map.flatten().argsort()]
    assert torch.equal(torch.repeat_interleave(torch.arange(E), split_sizes), experts_by_row)
    assert_close_rel(kernels.unpermute(x_sorted, row_map, None), K * x, torch.float32, what="sum of copies")


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_references_match_loop_in_float64(dtype):
    T, H, E, K = 33, 20, 7, 3
    x, ids = torch.randn(T, H).to(dtype), routing(T, E, K)
    x_sorted, sizes, row_map = kernels.reference_permute(x, ids, E)
    ref = loop_permute(x, ids, E)
    assert torch.equal(x_sorted.double(), ref[0]) and torch.equal(sizes, ref[1]) and torch.equal(row_map, ref[2])
    y_sorted, w = torch.randn(T * K, H, dtype=torch.float64), torch.rand(T, K, dtype=torch.float64)
    y = kernels.reference_unpermute(y_sorted, row_map, w)
    assert_close_rel(y, loop_unpermute(y_sorted, row_map, w), torch.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_matches_reference(dtype):
    dev = cuda_or_skip()
    T, H, E, K = 4099, 1000, 128, 8
    x, ids = torch.randn(T, H, device=dev).to(dtype), routing(T, E, K, torch.int32, dev)
    got, ref = kernels.permute(x, ids, E), kernels.reference_permute(x, ids, E)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    w = torch.rand(T, K, device=dev)
    y = kernels.unpermute(got[0], got[2], w)
    assert_close_rel(y, kernels.reference_unpermute(got[0].double(), got[2], w.double()), dtype)
    dy = torch.randn(T, H, device=dev).to(dtype)
    dys, dw = kernels.unpermute_bwd(dy, got[2], w, got[0])
    rs, rw = kernels.reference_unpermute_bwd(dy.double(), got[2], w.double(), got[0].double())
    assert_close_rel(dys, rs, dtype)
    assert_close_rel(dw, rw, dtype)
    # A column slice of x, read in place (rows H apart), copies exactly.
    part = x[:, 300:813]
    assert torch.equal(kernels.unpermute_bwd(part, got[2], None, None)[0], got[0][:, 300:813])
