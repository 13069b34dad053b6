import pytest
import torch

from fuseops.kernels._triton import device_sms
from fuseops.kernels.elementwise import bias_grad as kernels
from tests.helpers import DTYPES, assert_close_rel, cuda_or_skip

# (300, 3) is tall enough to split into several slabs (and the second stage).
SHAPES = [(1, 1), (3, 5), (37, 130), (0, 8), (300, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference_and_float64(dtype):
    for shape in SHAPES:
        dy = torch.randn(shape).to(dtype)
        db = kernels.bias_grad(dy)
        assert db.dtype == dtype and db.shape == (shape[1],)
        assert_close_rel(db, kernels.reference_bias_grad(dy), dtype, what=f"{shape} vs reference")
        assert_close_rel(db, dy.double().sum(0), dtype, what=f"{shape} vs float64")


def test_reference_is_the_sum_over_rows():
    dy = torch.randn(37, 130, dtype=torch.float64)
    assert torch.equal(kernels.reference_bias_grad(dy), dy.sum(0))
    assert torch.equal(kernels.reference_bias_grad(dy[:0]), torch.zeros(130, dtype=torch.float64))


def test_sums_in_float32():
    # 1024 ones in bf16 sum exactly in float32; a bf16 accumulator would stall at 256.
    dy = torch.ones(1024, 3, dtype=torch.bfloat16)
    assert torch.equal(kernels.bias_grad(dy), torch.full((3,), 1024.0, dtype=torch.bfloat16))


def test_row_split_covers_every_row():
    cfg = kernels._configs()
    t = torch.empty(0)
    for rows, cols in [(0, 8), (1, 1), (7, 3), (300, 3), (10_000, 5), (100, 100_000)]:
        programs, per_program = kernels.row_split(rows, cols, t, cfg)
        assert programs >= 1 and per_program % cfg.block_m == 0
        assert (programs - 1) * per_program < max(rows, 1) <= programs * per_program
        assert programs <= max(1, cfg.programs_per_sm * device_sms(t))


@pytest.mark.parametrize("P", [1, 3, 64, 65, 200])
def test_second_stage_gpu_tile_sums_every_partial_row(P, monkeypatch):
    """``sum_partials`` in its GPU tiles (``_second_stage``: 64 rows x 16 columns, wider past
    16384 columns), run by the interpreter: every partial row and column summed, columns past
    a multiple of the tile's too."""
    monkeypatch.setattr(kernels, "INTERPRET", False)
    assert kernels._second_stage(20000) == kernels.ReduceConfig(32, 32, num_warps=4, programs_per_sm=1)
    for N in (1, 15, 17, 100) + ((20000,) if P == 3 else ()):
        partials = torch.randn(P, N, dtype=torch.float32)
        for dtype in (torch.float32, torch.bfloat16):
            got = kernels.sum_partials(partials, dtype)
            assert got.dtype == dtype and got.shape == (N,)
            assert_close_rel(got, partials.double().sum(0), dtype, what=f"[{P}, {N}] {dtype}")


def test_deterministic():
    dy = torch.randn(300, 3).to(torch.bfloat16)
    assert torch.equal(kernels.bias_grad(dy), kernels.bias_grad(dy))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 4096), (16384, 14336), (100_000, 8), (2, 65536)], ids=str)
def test_gpu_large_bf16(shape):
    device = cuda_or_skip()
    dy = torch.randn(shape, device=device).to(torch.bfloat16)
    db = kernels.bias_grad(dy)
    assert_close_rel(db, dy.double().sum(0), torch.bfloat16)
    assert torch.equal(db, kernels.bias_grad(dy))
