"""``checked_group_offsets`` against its reference: the offsets, and the flag that says whether the
split sizes are non-negative and sum to the row count (through the interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from fuseops.kernels._triton import INTERPRET, interpreted_kernels
from fuseops.kernels.gemm.group_offsets import checked_group_offsets, reference_checked_group_offsets

CASES = [
    ([3, 0, 5], 8, 1),
    ([3, 0, 5], 9, 0),
    ([4, -1, 5], 8, 0),
    ([0], 0, 1),
    ([7], 7, 1),
    ([1] * 37, 37, 1),
    ([2, 2, 2, 2, 2], 9, 0),
]


def _devices() -> list[str]:
    return ["cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(), reason="needs the interpreter or a GPU")
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("sizes, rows, want_ok", CASES)
def test_checked_offsets_equal_the_reference(sizes, rows, want_ok, dtype):
    for device in _devices():
        split = torch.tensor(sizes, dtype=dtype, device=device)
        want_offsets, want_flag = reference_checked_group_offsets(split, rows)
        if device == "cpu":
            with interpreted_kernels():
                offsets, flag = checked_group_offsets(split, rows)
        else:
            offsets, flag = checked_group_offsets(split, rows)
        assert offsets.dtype == torch.int64 and offsets.tolist() == want_offsets.tolist()
        assert flag.dtype == torch.int32 and flag.tolist() == want_flag.tolist() == [want_ok]
