"""The order in which a grouped weight gradient's persistent programs walk the tiles of
``dw[g]`` [N, K]: along K first (pid_k fastest) or along N first.

Every tile reduces over all of its group's rows, and the programs of one wave step through
those rows together. Per row, a wave therefore reads the columns of dy and x that its tiles
cover, and only they: walked along K, a wave covers every K tile and a few N tiles, so x's
rows are read in full by every wave. When x's rows are wide and dy's narrow, that streams
x from HBM once per few N tiles. At Mixtral's FC2 wgrad (dy [T, 4096], x = h [T, 14336],
2048 rows per expert) a wave read ~60 MB, more than the H100's L2, for 13.6 waves per
expert; walked along N it reads ~22 MB.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fuseops.kernels._triton import cdiv


def n_fastest(n: int, k: int, block_n: int, block_k: int, programs: int) -> bool:
    """Whether the walk goes along N first: it does when that makes a wave of ``programs``
    tiles cover fewer columns of dy and x together (ties keep K first)."""
    tiles_n, tiles_k = cdiv(n, block_n), cdiv(k, block_k)
    if tiles_n == 0 or tiles_k == 0:
        return False
    along_k = min(programs, tiles_k) * block_k + min(cdiv(programs, tiles_k), tiles_n) * block_n
    along_n = min(programs, tiles_n) * block_n + min(cdiv(programs, tiles_n), tiles_k) * block_k
    return along_n < along_k


@triton.jit
def wgrad_tile(tile, tiles_n, tiles_k, N_FASTEST: tl.constexpr):
    """Tile ``tile`` of the walk: its group g (a group's tiles are consecutive) and its
    (pid_n, pid_k) inside ``dw[g]``. Plain integer arithmetic, so Gluon kernels call it too."""
    per_group = tiles_n * tiles_k
    g = tile // per_group
    local = tile % per_group
    if N_FASTEST:
        pid_n = local % tiles_n
        pid_k = local // tiles_n
    else:
        pid_n = local // tiles_k
        pid_k = local % tiles_k
    return g, pid_n, pid_k
