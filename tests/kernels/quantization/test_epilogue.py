"""The quantize epilogue's reference and buffers: what producers write, by format."""

import pytest
import torch

from fuseops.kernels.quantization import epilogue as qe
from fuseops.kernels.quantization.amax import reference_amax
from fuseops.kernels.quantization.formats import Element, Scaling
from fuseops.kernels.quantization.quantize import reference_quantize
from tests.helpers import DTYPES, assert_bitwise, poison_

# (scaling, element): the input formats of every recipe, and E5M2 for the block formats.
FORMATS = {
    "tensor": (Scaling.TENSOR, Element.E4M3),
    "block": (Scaling.BLOCK, Element.E4M3),
    "block_e5m2": (Scaling.BLOCK, Element.E5M2),
    "mx": (Scaling.MX, Element.E4M3),
    "mx_e5m2": (Scaling.MX, Element.E5M2),
    "nvfp4": (Scaling.NVFP4, Element.E2M1),
}


def poisoned_outputs(rows, n, dtype, device, scaling, element, store_y):
    """A producer's ``out``: y, data and scales poisoned (``row_amax`` stays zero: kernels max into it)."""
    out = qe.allocate(rows, n, dtype, device, scaling=scaling, element=element, store_y=store_y)
    for t in (out.y, out.data, out.scale):
        if t is not None:
            poison_(t.view(torch.uint8) if t.element_size() == 1 else t)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_reference_emit_is_the_row_wise_copy_or_the_row_amaxes(fmt, dtype):
    scaling, element = FORMATS[fmt]
    y = (torch.randn(37, 150) * 5).to(dtype)
    got = qe.reference_emit(y, scaling=scaling, element=element, store_y=False)
    assert got.y is None
    if qe.blocks_in_epilogue(scaling):
        ref = reference_quantize(y[None], None, None, scaling=scaling, element=element)
        assert_bitwise(got.data, ref.data[0], "data")
        assert_bitwise(got.scale, ref.scale[0], "scale")
        assert got.row_amax is None
    else:
        assert got.data is None and got.scale is None
        assert_bitwise(got.row_amax.amax()[None], reference_amax(y[None], None, 1), "amax")


@pytest.mark.parametrize("fmt", FORMATS)
def test_allocate_matches_the_reference_layout(fmt):
    scaling, element = FORMATS[fmt]
    y = torch.randn(5, 40, dtype=torch.bfloat16)
    out = qe.allocate(5, 40, y.dtype, y.device, scaling=scaling, element=element, store_y=True)
    ref = qe.reference_emit(y, scaling=scaling, element=element, store_y=True)
    for name, buf, value in zip(qe.Emitted._fields, out, ref):
        assert (buf is None) == (value is None), name
        if buf is not None:
            assert buf.shape == value.shape and buf.dtype == value.dtype, name
    if out.row_amax is not None:
        assert (out.row_amax == 0).all()
    assert qe.reference_emit(y, scaling=scaling, element=element, store_y=True, out=out) is out
