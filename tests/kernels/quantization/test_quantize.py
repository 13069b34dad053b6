"""quantize (every format, row-wise and column-wise) against their torch references.

The references are the spec, so the kernels must match them bit for bit: data, block scales
and the padding of the grouped column-wise layout. Outputs are poisoned first.
"""

from __future__ import annotations

import math

import pytest
import torch

from fuseops.kernels.quantization import quantize as kq
from fuseops.kernels.quantization.amax import amax
from fuseops.kernels.quantization.formats import BLOCK_SIZE, Element, Scaling, tensor_encode_scale
from fuseops.kernels.quantization.grouped_layout import padded_rows
from tests.helpers import assert_bitwise, poison_

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (scaling, element, block_2d)
FORMATS = {
    "tensor_e4m3": (Scaling.TENSOR, Element.E4M3, False),
    "tensor_e5m2": (Scaling.TENSOR, Element.E5M2, False),
    "block_1x128": (Scaling.BLOCK, Element.E4M3, False),
    "block_128x128": (Scaling.BLOCK, Element.E5M2, True),
    "mx_e4m3": (Scaling.MX, Element.E4M3, False),
    "mx_e5m2": (Scaling.MX, Element.E5M2, False),
    "nvfp4": (Scaling.NVFP4, Element.E2M1, False),
}
# Grouped rows: empty groups (first, middle, last), a group across a 128 boundary, a 1-row group.
SPLITS = [0, 5, 0, 150, 1, 0]


def make(layout: str, dtype: torch.dtype):
    """(x [B, R, C], offsets or None, number of tensors): rows and columns off every tile."""
    if layout == "dense":
        return torch.randn(1, 75, 161, device=DEVICE).to(dtype) * 3, None, 1
    if layout == "stacked":
        return torch.randn(3, 33, 70, device=DEVICE).to(dtype), None, 3
    offsets = torch.tensor([0] + torch.tensor(SPLITS).cumsum(0).tolist(), device=DEVICE)
    return torch.randn(1, sum(SPLITS), 97, device=DEVICE).to(dtype), offsets, len(SPLITS)


def encode_for(x, offsets, n, scaling, element):
    if scaling not in (Scaling.TENSOR, Scaling.NVFP4):
        return None
    return tensor_encode_scale(amax(x, offsets, n), scaling, element)


def assert_same(out: kq.Buffers, ref: kq.Buffers, what: str) -> None:
    for name, o, r in zip(kq.Buffers._fields, out, ref):
        assert_bitwise(o, r, f"{what} {name}")


def run(x, offsets, n, fmt, *, rowwise=True, columnwise=True):
    scaling, element, block_2d = fmt
    encode = encode_for(x, offsets, n, scaling, element)
    groups = offsets.shape[0] - 1 if offsets is not None else None
    out = kq.allocate(tuple(x.shape), groups, scaling=scaling, element=element, block_2d=block_2d,
                      rowwise=rowwise, columnwise=columnwise, device=x.device)
    for t in out:
        if t is not None:
            poison_(t.view(torch.uint8) if t.element_size() == 1 else t)
    kw = dict(scaling=scaling, element=element, block_2d=block_2d, rowwise=rowwise, columnwise=columnwise)
    got = kq.quantize(x, offsets, encode, out=out, **kw)
    assert got is out
    return got, kq.reference_quantize(x, offsets, encode, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["tensor_e4m3", "tensor_e5m2", "block_128x128"])
@pytest.mark.parametrize("layout", ["dense", "stacked", "grouped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_small_shapes(fmt, layout, dtype):
    """Whole-tile formats at row strides that are multiples of 16, where the one-pass form
    lost column-wise elements on float32 input (quantization/quantize.py)."""
    if layout == "grouped" and FORMATS[fmt][2]:
        pytest.skip("128x128 tiles are for stacked weights")
    x, offsets, n = make(layout, dtype)
    x = torch.randn(x.shape[0], 256 if layout == "dense" else x.shape[1], 80, device=DEVICE).to(dtype)
    got, ref = run(x, offsets, n, FORMATS[fmt])
    assert_same(got, ref, f"{fmt} {layout} {dtype}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("layout", ["dense", "stacked", "grouped"])
def test_quantize_matches_reference(fmt, layout):
    if layout == "grouped" and FORMATS[fmt][2]:
        pytest.skip("128x128 tiles are for stacked weights")
    x, offsets, n = make(layout, torch.bfloat16)
    got, ref = run(x, offsets, n, FORMATS[fmt])
    assert_same(got, ref, f"{fmt} {layout}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quantize_dtypes(fmt, dtype):
    x, offsets, n = make("dense", dtype)
    got, ref = run(x, offsets, n, FORMATS[fmt])
    assert_same(got, ref, f"{fmt} {dtype}")


@pytest.mark.parametrize("fmt", ["tensor_e4m3", "block_1x128", "nvfp4"])
@pytest.mark.parametrize("copies", [(True, False), (False, True)])
def test_one_copy(fmt, copies):
    x, offsets, n = make("grouped", torch.float32)
    got, ref = run(x, offsets, n, FORMATS[fmt], rowwise=copies[0], columnwise=copies[1])
    assert (got.data is not None, got.data_t is not None) == copies
    assert_same(got, ref, fmt)


def check_huge_values_and_zero_blocks(fmt):
    scaling, element, block_2d = FORMATS[fmt]
    x = torch.randn(1, 130, 256, device=DEVICE)
    x[0, :, :128] = 0.0
    x[0, 129, 130] = float("inf")
    x[0, 129, 131] = -3e38
    x[0, 7, 200] = 1e-30
    got, ref = run(x, None, 1, FORMATS[fmt])
    assert_same(got, ref, fmt)
    # The inf keeps its element (E4M3: NaN, E5M2: inf); every other code stays finite. NVFP4
    # (E2M1 has neither) marks the inf's block of 16 with a NaN scale, and no other block.
    at = {"data": (0, 129, 130), "data_t": (0, 130, 129), "scale": (0, 129, 130 // 16),
          "scale_t": (0, 130, 129 // 16)}
    for name, t in got._asdict().items():
        if t is None or t.dtype == torch.uint8:
            continue
        bad = ~torch.isfinite(t.float())
        expect = torch.zeros_like(bad)
        if name.startswith("data") or scaling == Scaling.NVFP4:
            expect[at[name]] = True
        assert torch.equal(bad, expect), (fmt, name, bad.nonzero().tolist())
    if got.scale is not None and not block_2d:
        # An all-zero block gets a finite scale (1, or 0 for NVFP4's E4M3 block scale).
        assert got.scale[0, 0, 0].float().item() == (0.0 if scaling == Scaling.NVFP4 else 1.0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_huge_values_stay_finite_an_inf_keeps_its_element_and_zero_blocks_stay_finite(fmt):
    check_huge_values_and_zero_blocks(fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_huge_values_stay_finite_an_inf_keeps_its_element_and_zero_blocks_stay_finite(fmt):
    """The GPU's satfinite conversions would saturate infinities: cast_fp8 puts them back."""
    check_huge_values_and_zero_blocks(fmt)


def plain_and_whole_rule_tiles(dtype: torch.dtype) -> torch.Tensor:
    """[1, 256, 384]: 128x128 tiles (the interpreter's), one clean, one with an inf, one with a
    NaN, one with the dtype's maximum, one with -P and one with the value just below P, P the
    largest power of two <= the maximum: the plain path (finite, below P) next to tiles of the
    whole rules, and both sides of its test."""
    fmax = torch.finfo(dtype).max
    p = 2.0 ** math.floor(math.log2(fmax))
    below_p = torch.tensor(p, dtype=dtype).view(torch.int16 if dtype.itemsize == 2 else torch.int32) - 1
    x = (torch.randn(1, 256, 384) * 3).to(dtype)
    x[0, 5, 130] = float("inf")
    x[0, 200, 10] = float("nan")
    x[0, 7, 300] = fmax
    x[0, 9, 301] = -fmax * 0.999
    x[0, 140, 140] = -p
    x[0, 141, 300] = below_p.view(dtype)
    x[0, 170, 301] = -below_p.view(dtype)
    return x.to(DEVICE)


def check_plain_and_whole_rule_tiles(fmt):
    # Also as groups (5, 0, 195, 1 and 55 rows): the inf and the NaN open groups whose padded
    # column-wise positions are not their rows, where a rewrite must find them.
    grouped = torch.tensor([0, 5, 5, 200, 201, 256], device=DEVICE)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = plain_and_whole_rule_tiles(dtype)
        for offsets, n in ((None, 1), (grouped, 5)):
            for rowwise, columnwise in ((True, True), (True, False), (False, True)):
                got, ref = run(x, offsets, n, FORMATS[fmt], rowwise=rowwise, columnwise=columnwise)
                assert_same(got, ref, f"{fmt} {dtype} groups={offsets is not None} rowwise={rowwise} "
                                      f"columnwise={columnwise}")


# Infinities and the dtype's maximum overflow the reference's float32 maths on the way.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("fmt", ["tensor_e4m3", "tensor_e5m2", "block_1x128", "mx_e4m3", "mx_e5m2", "nvfp4"])
def test_plain_tiles_beside_tiles_of_the_whole_rules(fmt):
    """Each tile of the 1D-block formats is first quantized without the non-finite and
    dtype-maximum rules, then again with them if its block maxima are not all finite and below
    P; a per-tensor tile is cast plainly, then its NaN and infinities' codes written over
    (quantize_kernel): bit for bit the reference either way, for every tile."""
    check_plain_and_whole_rule_tiles(fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["tensor_e4m3", "tensor_e5m2", "block_1x128", "mx_e4m3", "mx_e5m2", "nvfp4"])
def test_gpu_plain_tiles_beside_tiles_of_the_whole_rules(fmt):
    """The GPU's tilings, register caps and the rewrite of a tile after a barrier."""
    check_plain_and_whole_rule_tiles(fmt)


def test_zero_rows_and_empty_groups():
    x = torch.randn(1, 0, 40, device=DEVICE)
    offsets = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    bufs = kq.quantize(x, offsets, None, scaling=Scaling.MX, element=Element.E4M3, rowwise=True, columnwise=True)
    assert bufs.data.shape == (1, 0, 40)
    assert bufs.data_t.shape == (1, 40, padded_rows(0, 3))
    assert (bufs.data_t.view(torch.uint8) == 0).all()
    assert torch.equal(amax(x, offsets, 3), torch.zeros(3, device=DEVICE))


# (BLOCK_R, BLOCK_C, num_warps): chunks of 2, 4 and 8 rows of 8 bf16 per thread (the
# interpreter's own tile has 16).
TILES = [(16, 32, 1), (32, 64, 2), (64, 64, 2)]


def tile_fits(tile, fmt) -> bool:
    block = 128 if FORMATS[fmt][2] else BLOCK_SIZE[FORMATS[fmt][0]]
    return block == 0 or (tile[0] % block == 0 and tile[1] % block == 0)


def check_tiles(fmt, tile, dtype):
    scaling, element, block_2d = FORMATS[fmt]
    # Grouped rows (many padding tiles, slow in the interpreter) with the GPU tables' 8-row chunks.
    for layout in ("dense",) if block_2d or tile[0] < 64 else ("dense", "grouped"):
        x, offsets, n = make(layout, dtype)
        encode = encode_for(x, offsets, n, scaling, element)
        kw = dict(scaling=scaling, element=element, block_2d=block_2d, rowwise=True, columnwise=True)
        ref = kq.reference_quantize(x, offsets, encode, **kw)
        got = kq.allocate(tuple(x.shape), None if offsets is None else n, device=x.device, **kw)
        for t in got:
            if t is not None:
                poison_(t.view(torch.uint8) if t.element_size() == 1 else t)
        kq.launch_quantize(x, offsets, encode, scaling, element, block_2d, True, True, got, tile)
        assert_same(got, ref, f"{fmt} {layout} {tile}")


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("fmt", ["tensor_e4m3", "block_1x128", "mx_e4m3", "nvfp4"])
def test_every_chunk_height(fmt, tile):
    """Threads holding 2, 4 or 8 rows (16 in the other tests): blocks across 1 to 8 threads each way."""
    if not tile_fits(tile, fmt):
        pytest.skip("the tile is not a whole number of blocks")
    check_tiles(fmt, tile, torch.bfloat16)


def nvfp4_extremes(dtype) -> list[torch.Tensor]:
    """NVFP4 inputs at the edges of its scales: a tensor so small that its encode scale passes
    2**117 (exact division; a block of subnormals whose multiplier overflows turns 0 * inf into
    code 0), one so large that it is tiny, and block scales in E4M3's subnormal range (values
    saturate). The interpreter turns bfloat16 subnormals into wrong float32 values (triton
    3.6), so there the small tensor is float32 only."""
    tiny = torch.randn(1, 48, 64) * 1e-36
    tiny[0, 5, :16] = torch.randn(16) * 1e-40
    tiny[0, 5, 3:9] = 0.0
    tiny[0, 6, 16:32] = -0.0
    huge = torch.randn(1, 48, 64) * 1e37
    huge[0, 0, 0] = 3e38
    scales = torch.randn(1, 48, 64) * torch.logspace(-4, 0, 48)[None, :, None]
    scales[0, 0, 0] = 1e3
    cases = [huge, scales] if dtype == torch.bfloat16 and DEVICE == "cpu" else [tiny, huge, scales]
    return [t.to(dtype).to(DEVICE) for t in cases]


def check_nvfp4_extremes(dtype):
    for x in nvfp4_extremes(dtype):
        got, ref = run(x, None, 1, FORMATS["nvfp4"])
        assert_same(got, ref, f"nvfp4 extremes {dtype}")


# 0 * inf and an overflowing division are part of the reference's maths here.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_extreme_scales(dtype):
    check_nvfp4_extremes(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_nvfp4_extreme_scales_and_every_chunk_height(dtype):
    check_nvfp4_extremes(dtype)
    for fmt in FORMATS:
        for tile in TILES:
            if tile_fits(tile, fmt):
                check_tiles(fmt, tile, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_large(fmt, dtype):
    sizes = [1000, 0, 3000, 96, 4096]
    offsets = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), device=DEVICE)
    x = torch.randn(1, sum(sizes), 1536, device=DEVICE, dtype=dtype)
    for offs, n in ((None, 1), (offsets, len(sizes))):
        if offs is not None and FORMATS[fmt][2]:
            continue
        got, ref = run(x, offs, n, FORMATS[fmt])
        assert_same(got, ref, f"{fmt} grouped={offs is not None}")


@pytest.mark.parametrize("scaling", list(Scaling))
@pytest.mark.parametrize("block_2d", [False, True])
@pytest.mark.parametrize("rowwise, columnwise", [(True, False), (False, True), (True, True)])
def test_written_names_the_buffers_allocate_makes(scaling, block_2d, rowwise, columnwise):
    bufs = kq.allocate((1, 4, 256), None, scaling=scaling, element=Element.E4M3, block_2d=block_2d,
                       rowwise=rowwise, columnwise=columnwise, device="cpu")
    made = kq.Buffers(*(t is not None for t in bufs))
    assert kq.written(scaling, block_2d, rowwise, columnwise) == made
