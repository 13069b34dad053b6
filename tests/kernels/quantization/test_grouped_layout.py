"""The padded layout of grouped quantized tensors (``fuseops.kernels.quantization.grouped_layout``)."""

from __future__ import annotations

import torch

from fuseops.kernels.quantization import grouped_layout as layout

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_group_positions_padded_layout():
    offsets = torch.tensor([0, 5, 5, 300, 301], device=DEVICE)
    pos = layout.group_positions(offsets, 301)
    first = [128 * (o // 128 + g) for g, o in enumerate([0, 5, 5, 300])]
    assert pos[:5].tolist() == list(range(first[0], first[0] + 5))
    assert pos[5:300].tolist() == list(range(first[2], first[2] + 295))
    assert pos[300].item() == first[3]
    assert pos.max().item() < layout.padded_rows(301, 4)
    # Each group starts 128-aligned and no two groups share a 128-block.
    blocks = [set((p // 128).tolist()) for p in (pos[:5], pos[5:300], pos[300:])]
    assert all(a.isdisjoint(b) for i, a in enumerate(blocks) for b in blocks[i + 1:])
    assert layout.group_of_positions(offsets, layout.padded_rows(301, 4))[pos].tolist() == [0] * 5 + [2] * 295 + [3]
