"""quant_formats: the jit codecs against their torch twins and the formats' promises
(nearest-even float8 casts that saturate, never-saturating power-of-two scales, E2M1 codes,
the padded grouped layout)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given
from hypothesis import strategies as st

from fuseops.kernels.quantization import formats as qf
from fuseops.kernels.quantization.finite import fit_limit, reference_fit_source

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = [qf.Element.E4M3, qf.Element.E5M2]


@triton.jit
def _codec_kernel(x, fp8, codes, decoded, exps, N: tl.constexpr, ELEM: tl.constexpr):
    offs = tl.arange(0, N)
    v = tl.load(x + offs)
    tl.store(fp8 + offs, qf.to_fp8(v, ELEM))
    c = qf.e2m1_encode(v)
    tl.store(codes + offs, c)
    tl.store(decoded + offs, qf.e2m1_decode(c))
    tl.store(exps + offs, qf.pow2_exponent(tl.minimum(tl.abs(v), 3.4028234663852886e38), ELEM))


def run_codecs(x: torch.Tensor, element: qf.Element):
    n = x.numel()
    fp8 = torch.empty(n, dtype=qf.STORAGE_DTYPE[element], device=x.device)
    codes = torch.empty(n, dtype=torch.uint8, device=x.device)
    decoded = torch.empty(n, device=x.device)
    exps = torch.empty(n, dtype=torch.int32, device=x.device)
    _codec_kernel[(1,)](x, fp8, codes, decoded, exps, N=n, ELEM=int(element))
    return fp8, codes, decoded, exps


def special_values() -> torch.Tensor:
    """Ties, subnormals, signed zeros, the largest values, huge values and infinities."""
    ties = [1.0625, 1.1875, 1.3125, 0.75, 0.25, 2.5, 5.0, 3.5, 1.75, 1.25, 2**-10, 1.5 * 2**-10, 2**-17]
    edges = [0.0, -0.0, 448.0, 464.0, 480.0, 57344.0, 61440.0, 1e30, 3.4e38, float("inf"), 2**-126, 2**-149]
    v = torch.tensor(ties + edges)
    grid = torch.arange(-64, 64) * 0.125
    return torch.cat([v, -v, grid])


@pytest.mark.parametrize("element", FP8)
def test_codecs_match_torch(element):
    x = torch.cat([special_values(), torch.randn(4096) * torch.exp(torch.randn(4096) * 6)])
    x = torch.nn.functional.pad(x, (0, triton.next_power_of_2(x.numel()) - x.numel())).to(DEVICE)
    fp8, codes, decoded, exps = run_codecs(x, element)
    assert torch.equal(fp8.view(torch.uint8), qf.reference_to_fp8(x, element).view(torch.uint8))
    assert torch.equal(codes, qf.reference_e2m1_encode(x))
    assert torch.equal(decoded, qf.reference_e2m1_decode(codes))
    amax = x.abs().clamp(max=qf.FP32_MAX)
    assert torch.equal(exps, qf.reference_pow2_exponent(amax, element))


@pytest.mark.parametrize("element", FP8)
def test_fp8_saturates_finite_values_and_keeps_non_finite_ones(element):
    # Finite values saturate; NaN and infinities keep their element (E4M3 has no inf: NaN).
    x = torch.tensor([1e38, -1e38, 1e6, -1e6, 0.0, 1.0, float("inf"), -float("inf"), float("nan")] + [0.0] * 7,
                     device=DEVICE)
    fp8, *_ = run_codecs(x, element)
    fp8, x = fp8[:9], x[:9]
    fmax = qf.ELEMENT_MAX[element]
    assert fp8[:6].float().tolist() == [fmax, -fmax, fmax, -fmax, 0.0, 1.0]
    tail = fp8[6:].float()
    if element == qf.Element.E4M3:
        assert tail.isnan().all()
    else:
        assert tail[:2].tolist() == [float("inf"), -float("inf")] and tail[2].isnan()
    assert torch.equal(fp8.view(torch.uint8), qf.reference_to_fp8(x, element).view(torch.uint8))


@pytest.mark.parametrize("element", FP8)
def test_pow2_scale_is_the_smallest_that_does_not_saturate(element):
    amax = torch.rand(20000, dtype=torch.float64).mul(80).sub(60).exp2().float()
    k = qf.reference_pow2_exponent(amax, element)
    scaled = amax / qf.reference_exp2i(k)
    assert (scaled <= qf.ELEMENT_MAX[element]).all()
    # Half the scale would saturate: the scale is the smallest power of two that fits.
    assert (scaled * 2 > qf.ELEMENT_MAX[element]).all()
    assert qf.reference_pow2_exponent(torch.zeros(3), element).tolist() == [0, 0, 0]


def test_e2m1_table_and_ties():
    values = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 100.0, -0.3, -5.1])
    decoded = qf.reference_e2m1_decode(qf.reference_e2m1_encode(values))
    # Ties to the even code: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
    assert decoded.tolist() == [0, 0, 0.5, 1, 1, 1, 1.5, 2, 2, 2, 3, 4, 4, 4, 6, 6, -0.5, -6]


@triton.jit
def _e2m1_kernel(x, codes, packed, N: tl.constexpr):
    offs = tl.arange(0, N)
    v = tl.load(x + offs)
    tl.store(codes + offs, qf.e2m1_encode(v))
    lo, hi = tl.split(tl.reshape(qf.e2m1_bits(v), [N // 2, 2]))
    tl.store(packed + tl.arange(0, N // 2), qf.pack_e2m1(lo, hi))


def check_e2m1_encode_around_ties():
    points = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0,
                           7.0, 7.5, 8.0, 2**-126, 2**-149, 1e30, float("inf")])
    near = torch.stack([points.view(torch.int32) + d for d in range(-4, 5)]).flatten()
    v = near.clamp(0, 0x7F800000).view(torch.float32)
    v = torch.cat([v, -v, torch.rand(2048) * 8, torch.tensor([float("nan"), -float("nan"), -0.0, 0.0])])
    n = triton.next_power_of_2(v.numel())
    x = torch.nn.functional.pad(v, (0, n - v.numel())).to(DEVICE)
    codes = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    packed = torch.empty(n // 2, dtype=torch.uint8, device=DEVICE)
    _e2m1_kernel[(1,)](x, codes, packed, N=n)
    ref = qf.reference_e2m1_encode(x)
    assert torch.equal(codes, ref)
    assert torch.equal(packed, qf.reference_pack_e2m1(ref))
    # NaN fails every threshold of the reference: code 0.
    assert torch.isnan(x).sum() == 2 and (codes[torch.isnan(x)] == 0).all()


def test_e2m1_encode_at_and_around_every_tie():
    """Each code boundary, the values a few float32 ulps either side of it, saturation and NaN."""
    check_e2m1_encode_around_ties()


@pytest.mark.gpu
def test_gpu_e2m1_encode_at_and_around_every_tie():
    check_e2m1_encode_around_ties()


def test_sixth_by_fma_is_the_rounded_quotient():
    """``_sixth``'s GPU path (round(a * r), then the fma correction with r = float32(1/6)),
    replayed in float64 where each step is exact, against a / 6 rounded once: above 2**-125
    (every float32 there was checked offline; here powers of two, their neighbours and a
    sample of bit patterns); below it, results may be 1 ulp off (``_SIXTH_ENCODE_MAX``)."""
    pow2 = torch.arange(-125, 128, dtype=torch.int32)
    bits = torch.cat([(pow2 + 127) << 23, ((pow2 + 127) << 23) - 1, ((pow2 + 127) << 23) + 1,
                      torch.randint(0x01000000, 0x7F7FFFFF, (1 << 16,), dtype=torch.int32)])
    bits = bits[(bits >= 0x01000000) & (bits <= 0x7F7FFFFF)]
    a = bits.view(torch.float32).double()
    r = torch.tensor(1.0 / 6.0, dtype=torch.float32).double()
    q0 = (a * r).float().double()
    e = (a - 6.0 * q0).float().double()
    q = (q0 + e * r).float()
    assert torch.equal(q, (a / 6.0).float())


@pytest.mark.parametrize("element", FP8)
def test_cast_fp8_saturates_like_to_fp8(element):
    x = torch.cat([special_values(), torch.randn(2048) * 1e4]).to(DEVICE)
    x = torch.nn.functional.pad(x, (0, triton.next_power_of_2(x.numel()) - x.numel()))
    fp8, *_ = run_codecs(x, element)
    cast = torch.empty_like(fp8)
    _cast_kernel[(1,)](x, cast, N=x.numel(), ELEM=int(element))
    assert torch.equal(cast.view(torch.uint8), fp8.view(torch.uint8))


@triton.jit
def _cast_kernel(x, out, N: tl.constexpr, ELEM: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out + offs, qf.cast_fp8(tl.load(x + offs), ELEM))


@given(st.lists(st.integers(0, 15), min_size=1, max_size=33))
def test_e2m1_pack_round_trip(codes):
    c = torch.tensor(codes, dtype=torch.uint8)
    packed = qf.reference_pack_e2m1(c)
    assert packed.shape[-1] == (len(codes) + 1) // 2
    unpacked = qf.reference_unpack_e2m1(packed)[: len(codes)]
    assert torch.equal(unpacked, qf.reference_e2m1_decode(c))


@triton.jit
def _fit_kernel(v, mult, out, src_max, N: tl.constexpr, ELEM: tl.constexpr):
    offs = tl.arange(0, N)
    m = tl.load(mult + offs)
    tl.store(out + offs, qf.cast_fp8_within(tl.load(v + offs) * m, fit_limit(m, src_max, ELEM), ELEM))


def near_max_pairs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(v, amax) float32: every value of ``dtype`` from half its maximum up, either sign,
    against block maxima among them (every one for bfloat16, a spread and the top 64 for
    float16) that are at least |v|."""
    bits = torch.arange(0, 1 << (8 * dtype.itemsize - 1), dtype=torch.int32)
    values = bits.to(torch.int16 if dtype.itemsize == 2 else torch.int32).view(dtype).float()
    fmax = torch.finfo(dtype).max
    top = values[(values >= fmax / 2) & (values <= fmax)]
    maxima = top if top.numel() <= 256 else torch.cat([top[::16], top[-64:]])
    v, amax = torch.cat([top, -top])[:, None], maxima[None, :]
    keep = v.abs() <= amax
    return v.expand_as(keep)[keep], amax.expand_as(keep)[keep]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("element", FP8)
def test_fit_limit_clamp_is_the_reference_step(dtype, element):
    """The kernels clamp v * mult to the largest FP8 value whose quotient by mult stays within
    the dtype's maximum; the reference rounds and steps a code past it one toward zero: the
    same codes, for every value near the maximum against every block maximum above it."""
    v, amax = near_max_pairs(dtype)
    mult = qf.reference_exp2i(-qf.reference_pow2_exponent(amax, element))
    src_max = torch.finfo(dtype).max
    n = triton.next_power_of_2(v.numel())
    v, mult = (torch.nn.functional.pad(t, (0, n - t.numel()), value=1.0).to(DEVICE) for t in (v, mult))
    got = torch.empty(n, dtype=qf.STORAGE_DTYPE[element], device=DEVICE)
    _fit_kernel[(1,)](v, mult, got, src_max, N=n, ELEM=int(element))
    ref = reference_fit_source(qf.reference_to_fp8(v * mult, element), v, mult, src_max)
    assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
    # The range holds codes that the step moves (the test's point).
    assert (ref.view(torch.uint8) != qf.reference_to_fp8(v * mult, element).view(torch.uint8)).any()
