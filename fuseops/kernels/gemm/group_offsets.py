"""Group offsets of a grouped GEMM: split sizes [G] to int64 offsets [G + 1] on the same device.

Rows of group g are ``offsets[g]:offsets[g+1]``. A device prefix sum, so device split sizes
never cause a host sync (the grouped kernels read the offsets in-kernel). ``checked_group_offsets``
also says, in a device flag, whether the sizes are non-negative and sum to the row count: one
launch where the same check in torch ops takes five (the caller asserts the flag on the device).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import next_power_of_2
from fuseops.kernels.launch import launch


@triton.jit
def checked_group_offsets_kernel(sizes_ptr, offsets_ptr, ok_ptr, G, ROWS, BLOCK_G: tl.constexpr):
    # One program: the G sizes fit one block (G is the expert count).
    offs_g = tl.arange(0, BLOCK_G)
    mask_g = offs_g < G
    sizes = tl.load(sizes_ptr + offs_g, mask=mask_g, other=0).to(tl.int64)  # [BLOCK_G]
    ends = tl.cumsum(sizes, 0)
    tl.store(offsets_ptr + 1 + offs_g, ends, mask=mask_g)
    tl.store(offsets_ptr + offs_g, tl.zeros([BLOCK_G], dtype=tl.int64), mask=offs_g == 0)
    ok = (tl.sum(sizes, 0) == ROWS) & (tl.min(sizes, 0) >= 0)
    tl.store(ok_ptr, ok.to(tl.int32))


def group_offsets(split_sizes: torch.Tensor) -> torch.Tensor:
    """int64 [G + 1] exclusive prefix sums of ``split_sizes`` on its device, without a sync."""
    offsets = torch.zeros(split_sizes.shape[0] + 1, dtype=torch.int64, device=split_sizes.device)
    torch.cumsum(split_sizes, 0, out=offsets[1:])
    return offsets


def checked_group_offsets(split_sizes: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``group_offsets`` and whether the sizes are valid, in one launch.

    Args:
        split_sizes: [G] any integer dtype, on the GPU: rows per group.
        rows: the row count they must sum to.
    Returns:
        ``(offsets, ok)``: int64 [G + 1] offsets, and an int32 [1] flag, 1 where every size is
        >= 0 and they sum to ``rows`` (for ``torch._assert_async``).
    """
    G = split_sizes.shape[0]
    offsets = torch.empty(G + 1, dtype=torch.int64, device=split_sizes.device)
    ok = torch.empty(1, dtype=torch.int32, device=split_sizes.device)
    launch(checked_group_offsets_kernel, (1,), split_sizes, offsets, ok, G, rows,
           BLOCK_G=max(next_power_of_2(G), 2))
    return offsets, ok


def reference_group_offsets(split_sizes: torch.Tensor) -> torch.Tensor:
    """``offsets[0] = 0``, ``offsets[g + 1] = split_sizes[0] + ... + split_sizes[g]`` (int64)."""
    zero = torch.zeros(1, dtype=torch.int64, device=split_sizes.device)
    return torch.cat([zero, split_sizes.to(torch.int64).cumsum(0)])


def reference_checked_group_offsets(split_sizes: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``checked_group_offsets``: the offsets, and ``all(split_sizes >= 0) and sum == rows`` as int32 [1]."""
    offsets = reference_group_offsets(split_sizes)
    ok = ((split_sizes >= 0).all() & (offsets[-1] == rows)).to(torch.int32).reshape(1)
    return offsets, ok
