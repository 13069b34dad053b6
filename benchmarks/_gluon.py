"""Shared pieces of the Gluon experiments (benchmarks/gluon_*.py)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def tile_coords(tile, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of a persistent walk's tile: bands of GROUP_M M-tiles walked column by
    column, as fuseops.kernels.gemm.swizzle, so B tiles are reused from L2."""
    per_band = GROUP_M * tiles_n
    first_m = (tile // per_band) * GROUP_M
    band_m = gl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_band) % band_m, (tile % per_band) // band_m
