"""The wgrad walk order (gemm/wgrad_walk.py): which shapes walk along N first. The kernels' sums
under both orders are compared in their own tests (test_grouped_gemm_wgrad*.py,
gemm/test_grouped_scaled.py, hopper/test_blockwise_wgrad.py)."""

from __future__ import annotations

import pytest

from fuseops.kernels.gemm.wgrad_walk import n_fastest

H100_SMS = 132


@pytest.mark.parametrize(
    "n, k, expected",
    [
        # Mixtral FC1 wgrad, dw1 [2 * 14336, 4096]: x (4096 wide) is read whole by every wave.
        (28672, 4096, False),
        # Mixtral FC2 wgrad, dw2 [4096, 14336]: along K a wave reads all 14336 columns of h.
        (4096, 14336, True),
        # Qwen3-30B-A3B's FC2 (dw2 [2048, 768]): a group has fewer tiles than a wave, a tie.
        (2048, 768, False),
        (1536, 2048, False),
    ],
)
def test_the_wider_operand_is_not_swept_by_every_wave(n, k, expected):
    assert n_fastest(n, k, 128, 256, H100_SMS) is expected


def test_one_tile_wide_shapes_keep_k_first():
    assert not n_fastest(128, 256, 128, 256, H100_SMS)
    assert not n_fastest(100, 100_000, 128, 256, 1)


def test_empty_dw_has_an_order():
    assert not n_fastest(0, 4096, 128, 256, H100_SMS)
    assert not n_fastest(4096, 0, 128, 256, H100_SMS)
