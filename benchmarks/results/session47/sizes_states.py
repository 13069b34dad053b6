"""Session 47 probe (issue 20): ``benchmarks.sizes`` as is, printing after each cell the CUDA-graph state of every
program first recorded in it and captured at least once (phase, eager and graph samples as (enqueue ms, GPU span
ms), copied slots, results copied out). Call 2 found compiled fuseops 7-8 % slower than eager at T=16384 H=2048 with
4 graphs kept in that cell; ``compiled_graphs.py`` (calls 5-6) did not reproduce it outside the benchmark.

    python benchmarks/results/session47/sizes_states.py --part dense --acts gelu --H 2048 --rounds 4
"""
import sys

from benchmarks import sizes
from benchmarks.results.session40.graph_states import ms, programs  # records every program made

_measure = sizes.measure


def _measure_and_show(*args, **kwargs):
    first = len(programs)
    row = _measure(*args, **kwargs)
    print(f"-- cell done: {len(programs) - first} programs recorded in it; those captured:", flush=True)
    for i, ref in enumerate(programs[first:], first):
        g = ref()
        if g is not None and g.captures:
            copied = sum(b.numel() * b.element_size() for b in g.buffers.values()) / 2**20
            print(f"  program {i}: {g.phase:9s} captures {g.captures} eager {ms(g.eager_samples)} graph "
                  f"{ms(g.graph_samples)} copied {sorted(g.buffers)} ({copied:.0f} MB) copy_out {sorted(g.copy_out)} "
                  f"held {g.held / 2**20:.0f} MB", flush=True)
    return row


sizes.measure = _measure_and_show

if __name__ == "__main__":
    sys.argv[0] = "sizes"
    sizes.main()
