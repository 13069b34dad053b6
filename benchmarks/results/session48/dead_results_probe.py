"""Session 48 probe (branch dead-results): why the second routing layer's permute never settles on a graph on the GPU
(run 1: test_gpu_two_layers_of_one_shape_each_get_a_graph, 'measuring' after 20 steps, no drop), and what holds
memory with every program graphed at gelu T=16384 H=4096 (peak reserved 15.1 GB against 8.1 eager).

    python benchmarks/results/session48/dead_results_probe.py routing|dense|release
    python benchmarks/results/session48/dead_results_probe.py host [CELL [all]]

release: whether the shared pool goes back once a model with every program graphed is deleted (run 1's MoE cell
after gelu T=16384: 10.4 GB reserved, 2.5 GB allocated).
"""
import sys

import torch

from fuseops.moe import routing_graphs
from fuseops.ops.executor import graph_pool, graphed


def delta(before: dict, now: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


def routing() -> None:
    from tests.moe import test_routing_graphs as t
    for name in ("GPU_BOUND", "KEEP", "GPU_SLACK"):
        setattr(graphed, name, float("inf"))
    t.STEPS = 1
    steps = t._training("cuda", T=64, H=128, E=8, K=2, dtype=torch.bfloat16)
    for i in range(24):
        c, r = dict(graphed.counts), dict(graphed.refusals)
        steps()
        phases = {k[1]: [s.phase for s in kept] for k, kept in routing_graphs.states().items()}
        pool = graph_pool.pools()[0] if graph_pool.pools() else None
        held = None if pool is None else (len(pool.results), sum(isinstance(x, graph_pool.Placeholder) for x in pool.results))
        print(i, phases, delta(c, graphed.counts), delta(r, graphed.refusals), "results/placeholders", held, flush=True)


def dense() -> None:
    sys.argv = sys.argv[:1]
    from benchmarks.results.session46 import shared_pool
    r0 = dict(graphed.refusals)
    row = None
    graphed.GPU_BOUND = float("inf")
    step = shared_pool.build("gelu:16384:4096", False)
    for i in range(40):
        c = dict(graphed.counts)
        step()
        torch.cuda.synchronize()
        pool = graph_pool.pools()[0] if graph_pool.pools() else None
        segs = [s for s in torch.cuda.memory_snapshot() if pool is not None and pool._handle is not None
                and tuple(s.get("segment_pool_id", ())) == tuple(pool._handle)]
        in_pool = sum(s["total_size"] for s in segs) / 2**20
        print(i, delta(c, graphed.counts), f"reserved {torch.cuda.memory_reserved() / 2**20:.0f} MB,"
              f" shared pool {in_pool:.0f} MB in {len(segs)} segments, results",
              None if pool is None else len(pool.results), flush=True)
    print("refusals", delta(r0, graphed.refusals))
    del step, row


def release() -> None:
    import gc
    sys.argv = sys.argv[:1]
    from benchmarks.results.session46 import shared_pool
    graphed.GPU_BOUND = float("inf")
    step = shared_pool.build("gelu:4096:4096", False)
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    print("after 30 steps", dict(graphed.counts), f"reserved {torch.cuda.memory_reserved() / 2**20:.0f} MB")
    del step
    for name, act in (("free", graphed.free), ("gc", gc.collect), ("free again", graphed.free),
                      ("empty_cache", torch.cuda.empty_cache)):
        act()
        for pool in graph_pool.pools():
            alive = [r for r in pool.results if r.alive()]
            print(f"{name}: reserved {torch.cuda.memory_reserved() / 2**20:.0f} MB, members {len(pool.members)},"
                  f" results {len(pool.results)}, alive {len(alive)}, handle {pool._handle is not None},"
                  f" alive owners {[r.owner() is not None for r in alive][:6]}", flush=True)



def host() -> None:
    """Why the branch's host-bound cell is slower (run 6: gelu T=1024 H=1024 0.95-1.05 of torch eager's step against
    main's 0.74-0.86; four graphs dropped on the branch, none on main): each program's clobbers, the host time spent
    in ``graph_pool.clobbered`` a step, and the samples of each drop."""
    import time
    cell = sys.argv[2] if len(sys.argv) > 2 else "gelu:1024:1024"
    if sys.argv[3:] == ["all"]:  # every program graphed (FUSEOPS_CUDA_GRAPHS=all): why GPU-bound graphs are dropped
        graphed.GPU_BOUND = float("inf")
    sys.argv = sys.argv[:1]
    from benchmarks.results.session46 import shared_pool
    spent = [0.0, 0]
    real_clobbered, real_decision = graph_pool.clobbered, graphed.decision

    def timed_clobbered(clobbers):
        t = time.perf_counter()
        try:
            return real_clobbered(clobbers)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1

    def logged_decision(eager, graph):
        verdict = real_decision(eager, graph)
        if verdict == "drop":
            e = [(round(h * 1e3, 3), round(g * 1e3, 3)) for h, g in eager]
            s = [(round(h * 1e3, 3), round(g * 1e3, 3)) for h, g in graph]
            print("drop: eager", e, "graph", s, flush=True)
        return verdict

    graph_pool.clobbered, graphed.decision = timed_clobbered, logged_decision
    step = shared_pool.build(cell, False)
    counted = dict(graphed.counts)
    for i in range(60):
        spent[:] = [0.0, 0]
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        t = time.perf_counter() - t
        if i % 10 == 9:
            print(f"step {i}: {t * 1e3:.2f} ms, clobbered() {spent[1]} calls {spent[0] * 1e3:.3f} ms,"
                  f" counts {delta(counted, graphed.counts)}, reserved {torch.cuda.memory_reserved() / 2**20:.0f} MB",
                  flush=True)
            counted = dict(graphed.counts)
    for p in graphed._holding:
        print(p.phase, "clobbers", len(p.clobbers), "writes", len(p.writes), "results", len(p.pool_results))


if __name__ == "__main__":
    {"routing": routing, "dense": dense, "release": release, "host": host}[sys.argv[1]]()
