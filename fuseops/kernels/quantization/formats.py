"""Number formats of quantized compute: element codecs, scale rules and the grouped layout.

Every format stores ``x ~= q * s``: ``q`` a narrow element, ``s`` a scale. The maths here is
the spec; the quantize kernels (quantization/quantize.py) and the scaled GEMMs
(gemm/dense_scaled.py) call the ``@triton.jit`` codecs, the references and the storages the
torch twins below them.

- Elements: E4M3 (max 448) and E5M2 (max 57344) float8, rounded to nearest-even, finite
  values saturated; E2M1 (max 6), two codes per uint8, the first in the low nibble.
- Non-finite inputs: every scale (tensor or block) comes from the amax of the finite values
  alone, so one NaN or inf never erases the rest of the tensor. A NaN or inf keeps its element:
  E4M3 stores NaN (it has no infinity), E5M2 NaN or the signed infinity. E2M1 has neither: an
  NVFP4 block of 16 holding one gets a NaN E4M3 block scale, so exactly that block dequantizes
  to NaN (the other blocks of its row and tensor are untouched).
- Near the source dtype's maximum (BLOCK, MX and 128x128 tiles): a power-of-two scale keeps the
  block maximum within the element's range, but a value within half an FP8 step of the
  dtype's maximum would round up past it and dequantize to inf; such a code is stepped one
  value toward zero (``fit_limit``), so every finite input dequantizes to a finite value.
- ``Scaling.TENSOR``: one float32 scale per tensor (per group of a grouped tensor):
  ``encode = max_q / amax`` (1 when amax is 0), ``q = x * encode``, stored ``s = 1 / encode``.
- ``Scaling.BLOCK`` and ``Scaling.MX``: one power-of-two scale per block, the smallest with
  ``amax(block) / s <= max_q``, so the block maximum never saturates (the OCP MX spec rounds the
  exponent down instead, which saturates blocks whose amax mantissa exceeds max_q's). Exponents
  are clamped to [-126, 127]; an all-zero block gets ``s = 1``. BLOCK keeps ``s`` as float32,
  MX as E8M0 (``s = 2 ** (code - 127)``).
- ``Scaling.NVFP4``: E2M1 elements in blocks of 16 with an E4M3 block scale ``s_b`` and one
  float32 tensor scale: ``encode = 448 * 6 / amax(tensor)``, ``s_b = e4m3(amax(block) / 6 *
  encode)``, ``q = e2m1(x * encode / s_b)`` (0 where ``s_b`` underflows to 0), stored tensor
  scale ``1 / encode``; ``x ~= q * s_b / encode``.
"""

from __future__ import annotations

import enum

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET
from fuseops.kernels.quantization.finite import finite_abs

# The interpreter's float -> float8 cast rounds ties up and drops subnormals
# (TRITON_ON_CPU.md lists it as correct; measured wrong on triton 3.6), so under the
# interpreter values are rounded to the float8 grid first; the GPU's cvt.rn.satfinite is exact.
_EMULATE_FP8_CAST = tl.constexpr(INTERPRET)

FP32_MAX = torch.finfo(torch.float32).max
_FP32_MAX = tl.constexpr(FP32_MAX)


class Element(enum.IntEnum):
    """The narrow element type; its value is the kernels' ``ELEM`` constexpr."""

    E4M3 = 0
    E5M2 = 1
    E2M1 = 2


class Scaling(enum.IntEnum):
    """How scales apply; its value is the kernels' ``SCALING`` constexpr."""

    TENSOR = 0
    BLOCK = 1
    MX = 2
    NVFP4 = 3


ELEMENT_MAX = {Element.E4M3: 448.0, Element.E5M2: 57344.0, Element.E2M1: 6.0}
# The storage dtype of each element (E2M1 packed two per byte).
STORAGE_DTYPE = {Element.E4M3: torch.float8_e4m3fn, Element.E5M2: torch.float8_e5m2, Element.E2M1: torch.uint8}
# Block length along the quantized dim (TENSOR: none).
BLOCK_SIZE = {Scaling.TENSOR: 0, Scaling.BLOCK: 128, Scaling.MX: 32, Scaling.NVFP4: 16}


def element_of(dtype: torch.dtype) -> Element:
    return {torch.float8_e4m3fn: Element.E4M3, torch.float8_e5m2: Element.E5M2}[dtype]


@triton.jit
def exp2i(k):
    """``2.0 ** k`` as float32 for int32 ``k`` in [-126, 127], exactly (built from its bits)."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def pow2_exponent(amax, ELEM: tl.constexpr):
    """Exponent k of the smallest power-of-two scale with ``amax / 2**k <= max(ELEM)``
    (0 for amax 0), clamped to [-126, 127]; ``amax`` is finite and non-negative."""
    # max(E4M3) = 1.75 * 2**8, max(E5M2) = 1.75 * 2**15: amax's exponent, plus one where its
    # fraction exceeds 0.75 (0x600000), which is where adding 0x1FFFFF carries into it. A
    # finite amax keeps k <= 120, under the upper clamp.
    MAX_EXP: tl.constexpr = 8 if ELEM == 0 else 15
    k = ((amax.to(tl.int32, bitcast=True) + 0x1FFFFF) >> 23) - (127 + MAX_EXP)
    return tl.where(amax > 0, tl.maximum(k, -126), 0)


@triton.jit
def _round_to_fp8_grid(v, ELEM: tl.constexpr):
    """``v`` rounded to the nearest E4M3/E5M2 value (ties to even), still float32."""
    MANT: tl.constexpr = 3 if ELEM == 0 else 2
    MIN_EXP: tl.constexpr = -6 if ELEM == 0 else -14
    bits = v.to(tl.int32, bitcast=True)
    a = tl.abs(v)
    exp = tl.maximum(((bits >> 23) & 0xFF) - 127, MIN_EXP)
    # Adding 2**(exp - MANT + 23) leaves float32 a grid of 2**(exp - MANT): its RNE is ours.
    magic = exp2i(exp - MANT + 23)
    r = (a + magic) - magic
    # The sign goes back through the bits: negation would turn -0.0 into +0.0.
    return (r.to(tl.int32, bitcast=True) | ((bits >> 31) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def convert_fp8(v, ELEM: tl.constexpr):
    """float32 ``v`` converted to E4M3 (ELEM 0) or E5M2 (ELEM 1): nearest-even; the GPU's
    ``cvt.rn.satfinite`` saturates out-of-range values and infinities at the maximum (the
    interpreter clamps first). Exact for finite values in the format's range; ``cast_fp8``
    keeps non-finite ones."""
    r = v
    if _EMULATE_FP8_CAST:
        FMAX: tl.constexpr = 448.0 if ELEM == 0 else 57344.0
        r = _round_to_fp8_grid(tl.minimum(tl.maximum(v, -FMAX), FMAX), ELEM)
    if ELEM == 0:
        q = r.to(tl.float8e4nv)
    else:
        q = r.to(tl.float8e5)
    return q


@triton.jit
def keep_non_finite(q, v, ELEM: tl.constexpr):
    """Codes ``q`` of float32 ``v`` with those of NaN and infinities put back: satfinite would
    turn an infinity into the maximum (E4M3 has no infinity: NaN; E5M2: NaN and signed infinities)."""
    bits = q.to(tl.uint8, bitcast=True)
    if ELEM == 0:
        special = tl.full(bits.shape, 0x7F, tl.uint8)
    else:
        # NaN fails both comparisons: 0x7F.
        special = tl.where(v > 0, 0x7C, tl.where(v < 0, 0xFC, 0x7F)).to(tl.uint8)
    bits = tl.where(tl.abs(v) <= _FP32_MAX, bits, special)
    return bits.to(q.dtype, bitcast=True)


@triton.jit
def cast_fp8(v, ELEM: tl.constexpr):
    """float32 ``v`` cast to E4M3 (ELEM 0) or E5M2 (ELEM 1): nearest-even, NaN and infinities
    kept at their element; for values that need no clamp (``to_fp8`` has one)."""
    return keep_non_finite(convert_fp8(v, ELEM), v, ELEM)


@triton.jit
def cast_fp8_within(v, limit, ELEM: tl.constexpr):
    """``cast_fp8`` of float32 ``v`` whose finite values are first clamped to [-limit, limit]
    (``limit`` an element value, ``fit_limit``); NaN and infinities keep their element."""
    # The clamp turns NaN and infinities into +-limit: keep_non_finite looks at v.
    return keep_non_finite(convert_fp8(tl.minimum(tl.maximum(v, -limit), limit), ELEM), v, ELEM)


@triton.jit
def to_fp8(v, ELEM: tl.constexpr):
    """float32 ``v`` cast to E4M3 (ELEM 0) or E5M2 (ELEM 1): nearest-even, finite values
    saturating, NaN and infinities kept at their element (``cast_fp8``)."""
    FMAX: tl.constexpr = 448.0 if ELEM == 0 else 57344.0
    return cast_fp8(tl.where(tl.abs(v) <= _FP32_MAX, tl.minimum(tl.maximum(v, -FMAX), FMAX), v), ELEM)


@triton.jit
def finite_amax(t, axis):
    """``max |t|`` over the finite elements along ``axis`` (0 where none is finite)."""
    return tl.max(finite_abs(t), axis=axis)


# The interpreter's fma rounds the product first.
_FMA = tl.constexpr(not INTERPRET)
# Below this NVFP4 encode scale, a block whose amax / 6 is 1 ulp off in ``_sixth`` (amax <
# 2**-125) gets a zero scale either way: amax / 6 * enc < 2**-10.
_SIXTH_ENCODE_MAX = tl.constexpr(2.0**117)


@triton.jit
def _sixth(amax):
    """``amax / 6`` rounded to nearest for float32 amax >= 2**-125 (every such float32 checked
    exhaustively): the product with the rounded 1/6, corrected by one fma."""
    if _FMA:
        q = amax * (1.0 / 6.0)
        q = tl.fma(tl.fma(q, -6.0, amax), 1.0 / 6.0, q)
    else:
        q = tl.math.div_rn(amax, 6.0)
    return q


@triton.jit
def block_scales(amax, bad, enc, SCALING: tl.constexpr, ELEM: tl.constexpr):
    """(multiplier, stored scale) of blocks with finite maxima ``amax``, ``enc`` the tensor's
    encode scale (NVFP4): the scale rules above, as the quantize kernels apply them. E2M1 has
    no NaN or infinity: an NVFP4 block holding one (``bad``) gets a NaN scale, so the whole
    block (and no other) dequantizes to NaN."""
    if SCALING == 3:
        # One branch for the whole program (enc is the tensor's): three fmas instead of a division.
        if enc < _SIXTH_ENCODE_MAX:
            q = _sixth(amax)
        else:
            q = tl.math.div_rn(amax, 6.0)
        # cvt.satfinite saturates as to_fp8's clamp would (the product is not NaN).
        s = cast_fp8(q * enc, 0)
        sf = s.to(tl.float32)
        # An E4M3 scale that underflows to 0 zeroes its block (no division by zero).
        mult = tl.where(sf > 0, tl.math.div_rn(tl.zeros_like(sf) + enc, tl.where(sf > 0, sf, 1.0)), 0.0)
        s = tl.where(bad != 0, tl.full(s.shape, 0x7F, tl.uint8), s.to(tl.uint8, bitcast=True)).to(
            tl.float8e4nv, bitcast=True)
    else:
        k = pow2_exponent(amax, ELEM)
        mult = exp2i(-k)
        if SCALING == 1:
            s = exp2i(k)
        else:
            s = (k + 127).to(tl.uint8)
    return mult, s


@triton.jit
def e2m1_bits(v):
    """int32 whose low byte is the E2M1 code (sign in bit 3) of float32 ``v``, nearest-even,
    saturating at 6, NaN to 0, and whose other bits lie above it (``pack_e2m1`` packs two)."""
    a = tl.minimum(tl.abs(v), 6.0, propagate_nan=tl.PropagateNan.ALL)
    # Up to 6 the code is round(min(2a, a + 2, a / 2 + 4)): steps of .5, 1 and 2 on [0, 2],
    # [2, 4] and [4, 6], each even code on an even integer, so nearest-even on the integers is
    # E2M1's. Each line plus 2**23 rounds once to an integer, held in the low mantissa bits.
    line = tl.minimum(tl.minimum(a * 2.0 + 8388608.0, a + 8388610.0), a * 0.5 + 8388612.0)
    # max ignores NaN: code 0, as a NaN fails every threshold of the reference (a NaN v comes
    # from 0 * inf where a block's multiplier overflows).
    line = tl.maximum(line, 8388608.0)
    return tl.where(v < 0, line + 8.0, line).to(tl.int32, bitcast=True)


@triton.jit
def e2m1_encode(v):
    """uint8 E2M1 codes (sign in bit 3) of float32 ``v``: nearest-even, saturating at 6."""
    return (e2m1_bits(v) & 15).to(tl.uint8)


@triton.jit
def e2m1_decode(code):
    """float32 values of uint8 E2M1 codes, built from their bits (exact, -0.0 kept)."""
    mag = (code & 7).to(tl.int32)
    exp = mag >> 1
    man = mag & 1
    bits = tl.where(exp == 0, man * (126 << 23), ((exp + 126) << 23) | (man << 22))
    return (bits | ((code & 8).to(tl.int32) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def pack_e2m1(lo, hi):
    """Bytes of E2M1 pairs from ``e2m1_bits`` (or codes): ``lo`` in the low nibble."""
    # What e2m1_bits holds above its low byte stays above it after the shift by 4 (wrapping).
    return (hi * 16 + lo).to(tl.uint8)


@triton.jit
def unpack_e2m1(packed, ROWS: tl.constexpr, COLS: tl.constexpr):
    """[ROWS, COLS // 2] bytes -> [ROWS, COLS] float32 values."""
    return e2m1_decode(tl.reshape(tl.join(packed & 15, packed >> 4), [ROWS, COLS]))


def reference_exp2i(k: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(k, dtype=torch.float32), k)


def reference_pow2_exponent(amax: torch.Tensor, element: Element) -> torch.Tensor:
    """``pow2_exponent`` in torch (int32)."""
    bits = amax.float().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) - 127
    k = exp - (8 if element == Element.E4M3 else 15) + ((bits & 0x7FFFFF) > 0x600000).int()
    return torch.where(amax > 0, k.clamp(-126, 127), 0).int()


def reference_to_fp8(v: torch.Tensor, element: Element) -> torch.Tensor:
    """Nearest-even, finite values saturating at the maximum; NaN and infinities keep their
    element (E4M3: NaN 0x7F; E5M2: NaN 0x7F, +-inf 0x7C / 0xFC), as ``cast_fp8``."""
    fmax = ELEMENT_MAX[element]
    v = v.float()
    bits = v.clamp(-fmax, fmax).to(STORAGE_DTYPE[element]).view(torch.uint8)
    if element == Element.E4M3:
        special = torch.full_like(bits, 0x7F)
    else:
        special = torch.where(v > 0, 0x7C, torch.where(v < 0, 0xFC, 0x7F)).to(torch.uint8)
    return torch.where(v.abs() <= FP32_MAX, bits, special).view(STORAGE_DTYPE[element])


_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def reference_e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    a = v.float().abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for i, mid in enumerate(_E2M1_MIDPOINTS):
        # Even codes (0, 2, 4, 6) take the ties: ">" below them, ">=" above.
        code += (a > mid) if i % 2 == 0 else (a >= mid)
    return code | ((v < 0).to(torch.uint8) << 3)


def reference_e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=code.device)
    return table[code.long()]


def reference_pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., C] codes -> [..., ceil(C / 2)] bytes (an odd last element pairs with a zero)."""
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def reference_unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[..., B] bytes -> [..., 2B] float32 values."""
    pairs = torch.stack([reference_e2m1_decode(packed & 15), reference_e2m1_decode(packed >> 4)], -1)
    return pairs.flatten(-2)


def tensor_qmax(scaling: Scaling, element: Element) -> float:
    """What a tensor's amax maps to: the element's maximum (TENSOR), 448 * 6 (NVFP4)."""
    return 448.0 * 6.0 if scaling == Scaling.NVFP4 else ELEMENT_MAX[element]


def tensor_encode_scale(amax: torch.Tensor, scaling: Scaling, element: Element) -> torch.Tensor:
    """float32 ``encode`` per tensor (or group) from its amax, on amax's device (no sync):
    ``max_q / amax`` for TENSOR, ``448 * 6 / amax`` for NVFP4; 1 where amax is 0."""
    a = amax.float().clamp(max=FP32_MAX)
    # A true division: ``qmax / a`` on a tensor would multiply by its reciprocal instead.
    encode = (torch.full_like(a, tensor_qmax(scaling, element)) / a).clamp(max=FP32_MAX)
    return torch.where(a > 0, encode, torch.ones_like(encode))


def reference_dequantize(data: torch.Tensor, scale: torch.Tensor | None, scaling: Scaling,
                         rows_per_scale: int = 1) -> torch.Tensor:
    """float32 values of quantized rows ``data`` [..., R, L] (E2M1: L bytes hold 2L values):
    elements times their block scales (``scale`` [..., R / rows_per_scale, nblocks]); tensor
    scales are not applied."""
    v = reference_unpack_e2m1(data) if scaling == Scaling.NVFP4 else data.float()
    if scaling == Scaling.TENSOR:
        return v
    R, L = v.shape[-2:]
    s = scale.float()
    if rows_per_scale > 1:
        s = s.repeat_interleave(rows_per_scale, -2)[..., :R, :]
    return v * s.repeat_interleave(BLOCK_SIZE[scaling], -1)[..., :L]
