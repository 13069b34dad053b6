"""Group offsets of a grouped GEMM: split sizes [G] to int64 offsets [G + 1] on the same device.

Rows of group g are ``offsets[g]:offsets[g+1]``. A device prefix sum, so device split sizes
never cause a host sync (the grouped kernels read the offsets in-kernel).
"""

from __future__ import annotations

import torch


def group_offsets(split_sizes: torch.Tensor) -> torch.Tensor:
    """int64 [G + 1] exclusive prefix sums of ``split_sizes`` on its device, without a sync."""
    offsets = torch.zeros(split_sizes.shape[0] + 1, dtype=torch.int64, device=split_sizes.device)
    torch.cumsum(split_sizes, 0, out=offsets[1:])
    return offsets


def reference_group_offsets(split_sizes: torch.Tensor) -> torch.Tensor:
    """``offsets[0] = 0``, ``offsets[g + 1] = split_sizes[0] + ... + split_sizes[g]`` (int64)."""
    zero = torch.zeros(1, dtype=torch.int64, device=split_sizes.device)
    return torch.cat([zero, split_sizes.to(torch.int64).cumsum(0)])
