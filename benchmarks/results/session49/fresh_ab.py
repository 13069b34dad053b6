"""Session 49 A/B: ``shared_pool.py``'s memory with every program graphed, first in a fresh process, with and without
the wait for the timed runs under FUSEOPS_CUDA_GRAPHS=all (runs 12 and 13: peak reserved 5,102 / 5,152 MB without,
3,450 / 3,274 with, at GELU / SwiGLU T=4096 H=4096, one process each).

    python benchmarks/results/session49/fresh_ab.py wait|nowait CELL
"""
import sys

from benchmarks.results.session46 import shared_pool
from fuseops.ops.executor import graphed

if sys.argv[1] == "nowait":
    complete = graphed.GraphedProgram._complete
    graphed.GraphedProgram._complete = lambda self, wait=False: complete(self, False)
sys.argv = [sys.argv[0], "--cells", sys.argv[2], "--variants", "all_shared"]
shared_pool.main()
