"""The quantize kernel's tile helpers: the chunked [NC, NR, K, V] layout of a loaded tile,
its blocks' scales and codes, and their stores along rows or (the transpose) along columns
(quantization/quantize.py's docstring has the layout; quantization/epilogue.py quantizes GEMM tiles with
``quantize_blocks``)."""

from __future__ import annotations

import triton
import triton.language as tl

from fuseops.kernels.quantization.finite import any_non_finite, fit_limit, max_with_nan
from fuseops.kernels.quantization.formats import (
    block_scales,
    cast_fp8_within,
    convert_fp8,
    e2m1_bits,
    e2m1_encode,
    finite_amax,
    pack_e2m1,
)


@triton.jit
def quantize_blocks(t, enc, src_max, SCALING: tl.constexpr, ELEM: tl.constexpr, BLOCK: tl.constexpr,
                    ROWS: tl.constexpr, COLS: tl.constexpr):
    """Quantize blocks of BLOCK along the last dim of [ROWS, COLS] ``t`` (of a tensor whose
    dtype's maximum is ``src_max``): (q, s) as stored, q [ROWS, COLS] float8 (E2M1 codes for
    NVFP4), s [ROWS, COLS // BLOCK]."""
    tb = tl.reshape(t, [ROWS, COLS // BLOCK, BLOCK])
    mult, s = block_scales(finite_amax(tb, 2), any_non_finite(tb, 2), enc, SCALING, ELEM)
    if SCALING == 3:
        q = e2m1_encode(tb * mult[:, :, None])
    else:
        q = cast_fp8_within(tb * mult[:, :, None], fit_limit(mult, src_max, ELEM)[:, :, None], ELEM)
    return tl.reshape(q, [ROWS, COLS]), s


@triton.jit
def chunk_offsets(NC: tl.constexpr, NR: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Row and column in the tile of the chunked [NC, NR, K, V] layout, (c, r, k, v) at row
    r * K + k and column c * V + v: offs_r [1, NR, K, 1], offs_c [NC, 1, 1, V]."""
    offs_r = tl.arange(0, NR)[None, :, None, None] * K + tl.arange(0, K)[None, None, :, None]
    offs_c = tl.arange(0, NC)[:, None, None, None] * V + tl.arange(0, V)[None, None, None, :]
    return offs_r, offs_c


@triton.jit
def store_chunks(ptr, q, lines, mask_l, stride_l, start, length, PACKED: tl.constexpr, ALONG_ROWS: tl.constexpr,
                 STAGED: tl.constexpr):
    """Store chunked codes ``q`` [NC, NR, K, V] in ``lines`` (the tile's rows, ALONG_ROWS, or
    its columns), at positions ``start``.. below ``length`` along them; PACKED: E2M1 codes,
    two per byte along the line, the first in the low nibble; STAGED: columns through shared
    memory (``QuantizeConfig``)."""
    NC: tl.constexpr = q.shape[0]
    NR: tl.constexpr = q.shape[1]
    K: tl.constexpr = q.shape[2]
    V: tl.constexpr = q.shape[3]
    if PACKED:
        if ALONG_ROWS:
            lo, hi = tl.split(tl.reshape(q, [NC, NR, K, V // 2, 2]))
            _, offs = chunk_offsets(NC, NR, K, V // 2)
        else:
            # The pairs sit in one thread: (k, k + 1) of its K rows.
            lo, hi = tl.split(tl.permute(tl.reshape(q, [NC, NR, K // 2, 2, V]), (0, 1, 2, 4, 3)))
            offs, _ = chunk_offsets(NC, NR, K // 2, V)
        q = pack_e2m1(lo, hi)
    else:
        offs_r, offs_c = chunk_offsets(NC, NR, K, V)
        offs = offs_c if ALONG_ROWS else offs_r
    if STAGED and not ALONG_ROWS:
        # The transpose [columns, positions], NB bytes of each chunk along a column: Triton lays
        # its store out as 16-byte runs along the positions, through shared memory.
        NB: tl.constexpr = q.shape[2]
        q_t = tl.reshape(tl.permute(q, (0, 3, 1, 2)), [NC * V, NR * NB])
        lines_t = tl.reshape(tl.permute(lines, (0, 3, 1, 2)), [NC * V, 1])
        mask_t = tl.reshape(tl.permute(mask_l, (0, 3, 1, 2)), [NC * V, 1])
        pos = start + tl.arange(0, NR * NB)[None, :]
        tl.store(ptr + lines_t * stride_l + pos, q_t, mask=mask_t & (pos < length))
    else:
        tl.store(ptr + lines * stride_l + start + offs, q, mask=mask_l & (start + offs < length))


@triton.jit
def _blocked(tile, ALONG_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """The chunked ``tile`` [NC, NR, K, V] as blocks of BLOCK along its rows (ALONG_ROWS) or its
    columns: a block's values sit in axis IN (4 along rows, else 3) of BLOCK // V threads of V
    columns (along rows) or of BLOCK // K threads of K rows, axis ACROSS (1, else 2): a
    reduction in registers, then warp shuffles."""
    NC: tl.constexpr = tile.shape[0]
    NR: tl.constexpr = tile.shape[1]
    K: tl.constexpr = tile.shape[2]
    V: tl.constexpr = tile.shape[3]
    if ALONG_ROWS:
        t = tl.reshape(tile, [NC // (BLOCK // V), BLOCK // V, NR, K, V])
    else:
        t = tl.reshape(tile, [NC, NR // (BLOCK // K), BLOCK // K, K, V])
    return t


@triton.jit
def block_peaks(tile, ALONG_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """``max |t|`` of each block of the chunked ``tile`` (``store_blocks``'s layout), NaN where
    the block holds a NaN: one max per element gives both the plain path's block maxima and
    its test (``plain_limit``)."""
    IN: tl.constexpr = 4 if ALONG_ROWS else 3
    ACROSS: tl.constexpr = 1 if ALONG_ROWS else 2
    a = tl.abs(_blocked(tile, ALONG_ROWS, BLOCK))
    return max_with_nan(max_with_nan(a, IN), ACROSS)


@triton.jit
def store_blocks(tile, peak, enc, src_max, data, scale, lines, mask_l, stride_d, stride_s, start, length,
                 stored_length, PLAIN: tl.constexpr, ALONG_ROWS: tl.constexpr, SCALING: tl.constexpr,
                 ELEM: tl.constexpr, BLOCK: tl.constexpr, STAGED: tl.constexpr):
    """Quantize the chunked ``tile`` [NC, NR, K, V] in blocks of BLOCK along its rows
    (ALONG_ROWS) or its columns and store codes and scales (``store_chunks``'s arguments;
    ``length`` counts elements along a line, ``stored_length`` stored codes; ``src_max`` the
    source dtype's maximum, ``fit_limit``). PLAIN: ``peak`` holds the tile's ``block_peaks``
    (None otherwise), and the tile is taken to have passed ``plain_limit``: every value finite
    and none rounding past ``src_max``, so that the cast needs neither rule (the same codes);
    else the whole rules (a tile that fails the test gets both after a plain pass)."""
    NC: tl.constexpr = tile.shape[0]
    NR: tl.constexpr = tile.shape[1]
    K: tl.constexpr = tile.shape[2]
    V: tl.constexpr = tile.shape[3]
    IN: tl.constexpr = 4 if ALONG_ROWS else 3
    ACROSS: tl.constexpr = 1 if ALONG_ROWS else 2
    t = _blocked(tile, ALONG_ROWS, BLOCK)
    if ALONG_ROWS:
        offs_s = tl.arange(0, NC // (BLOCK // V))[:, None, None, None]
    else:
        offs_s = tl.arange(0, NR // (BLOCK // K))[None, :, None, None]
    if PLAIN:
        mult, s = block_scales(peak, tl.zeros(peak.shape, tl.int32), enc, SCALING, ELEM)
    else:
        bad = tl.max(any_non_finite(t, IN), ACROSS)
        mult, s = block_scales(tl.max(finite_amax(t, IN), ACROSS), bad, enc, SCALING, ELEM)
    mult_t = tl.expand_dims(tl.expand_dims(mult, ACROSS), IN)
    v = t * mult_t
    if SCALING == 3:
        q = e2m1_bits(v)
    elif PLAIN:
        q = convert_fp8(v, ELEM)
    else:
        # Scaled by the block's power of two, finite values fit the format; non-finite ones
        # keep their element.
        lim = tl.expand_dims(tl.expand_dims(fit_limit(mult, src_max, ELEM), ACROSS), IN)
        q = cast_fp8_within(v, lim, ELEM)
    # Scales [NC // (BLOCK // V), NR, K, 1] along rows, [NC, NR // (BLOCK // K), 1, V] along columns.
    offs_s += start // BLOCK
    tl.store(scale + lines * stride_s + offs_s, tl.expand_dims(s, IN - 1),
             mask=mask_l & (offs_s < tl.cdiv(length, BLOCK)))
    # E2M1: two codes per stored byte.
    STEP: tl.constexpr = 2 if SCALING == 3 else 1
    store_chunks(data, tl.reshape(q, [NC, NR, K, V]), lines, mask_l, stride_d, start // STEP, stored_length,
                 SCALING == 3, ALONG_ROWS, STAGED)
