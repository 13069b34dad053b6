"""The grouped launchers' TMA checks (cut to one stride() a tensor, and no views for a pair's
halves) decide as the plain statement of the rule does; the check of a tensor not yet made
(``dense.fresh_tma_ok``) as ``dense.tma_ok`` of the fresh tensor."""

import itertools

import torch

from fuseops.kernels.gemm import dense
from fuseops.kernels.gemm.grouped import tma_ok
from fuseops.kernels.gemm.grouped_gated import pair_tma_ok, pair_views


def rule(t):
    """16-bit, non-empty, last dim contiguous, base and every other stride 16-byte aligned."""
    es = t.element_size()
    return (es == 2 and t.numel() > 0 and t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s * es % 16 == 0 for s in t.stride()[:-1]))


def tensors():
    for dtype, rows, cols, offset, transpose in itertools.product(
            (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn), (0, 3, 8),
            (1, 2, 7, 8, 16, 24, 64), (0, 1, 8), (False, True)):
        base = torch.zeros(rows * (cols + offset) + offset + 64, dtype=torch.float32).to(dtype)
        t = base[offset:offset + rows * cols].view(rows, cols) if rows else base[:0].view(0, cols)
        if transpose:
            t = t.t()
        yield t
        if t.dim() == 2 and t.shape[1] > 2:
            yield t[:, : t.shape[1] - 1]  # rows wider than the view
        yield t.unsqueeze(0).expand(3, *t.shape)  # a zero batch stride
    yield torch.zeros(8, 16, dtype=torch.bfloat16)[:, :1]  # aligned, but a pair's first half is empty


def test_tma_ok_follows_the_rule():
    seen = set()
    for t in tensors():
        assert tma_ok(t) == rule(t), (t.dtype, t.shape, t.stride(), t.data_ptr() % 16)
        seen.add(rule(t))
    assert seen == {True, False}
    assert tma_ok(None) and tma_ok()


def test_pair_tma_ok_equals_the_check_of_both_views():
    seen = set()
    for t in tensors():
        for interleaved in (False, True):
            want = tma_ok(*pair_views(t, interleaved))
            assert pair_tma_ok(t, interleaved) == want, (t.dtype, t.shape, t.stride(), interleaved)
            seen.add(want)
    assert seen == {True, False}
    assert pair_tma_ok(None, False)


def test_fresh_tma_ok_equals_the_check_of_a_fresh_tensor():
    seen = set()
    dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.uint8)
    for dtype, shape in itertools.product(dtypes, [(5,), (0, 8), (3, 7), (3, 8), (3, 16), (2, 3, 8), (2, 3, 16),
                                                   (4, 16, 3), (1, 1, 1), (2, 0, 16), (7, 200), (7, 208)]):
        want = dense.tma_ok(torch.empty(shape, dtype=dtype))
        assert dense.fresh_tma_ok(shape, dtype) == want, (dtype, shape)
        seen.add(want)
    assert seen == {True, False}
