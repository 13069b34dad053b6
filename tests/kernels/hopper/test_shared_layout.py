"""``pipeline.shared_layout`` (cached per block and dtype) equals Triton's layout made afresh."""

import torch
from triton.experimental.gluon import language as gl

from fuseops.kernels.hopper.pipeline import GL_DTYPES, shared_layout


def test_cached_layouts_equal_fresh_ones_whatever_the_order():
    blocks = [(1, 1, 64, 64), (1, 1, 64, 256), (1, 64, 128), (1, 64, 256), (128, 128), (64, 128), (8, 16)]
    dtypes = [torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float16]
    # Twice, dtypes alternating within each block: a cache keyed by block alone, or by
    # dtype alone, hands a later call an earlier call's (different) layout.
    for _ in range(2):
        for block in blocks:
            for dtype in dtypes:
                fresh = gl.NVMMASharedLayout.get_default_for(list(block), GL_DTYPES[dtype])
                assert shared_layout(block, dtype) == fresh, (block, dtype)
    distinct = {repr(shared_layout((1, 64, 128), d)) for d in dtypes}
    assert len(distinct) == 3  # 8-, 16- and 32-bit elements: the cases above tell keys apart
