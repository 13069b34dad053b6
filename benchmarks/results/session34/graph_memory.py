"""Session 34: what fuseops' CUDA graphs hold, per token count, against torch eager's step.

Call 4's dense run left 6.1 GiB allocated after SwiGLU H=4096 T=1024, 8.1 after T=4096 and 18.6 after
T=16384 (one model through every T). Here one model, eager only: per T, 40 steps, then (after a
collection) what stays allocated, the bytes of results the live graphs hold (``pool_results``) by
phase, and the step's peak above what was allocated before it, beside torch eager's on the same T.

    PYTHONPATH=. python benchmarks/results/session34/graph_memory.py --H 4096 --T 1024 4096 16384
"""
import argparse
import gc

import torch

from benchmarks import sizes
from fuseops.ops.executor import graphed

MB = 2**20


def graphs_held() -> dict[str, float]:
    """MiB of results each phase's live graphs hold, and how many programs are in each phase."""
    held: dict[str, float] = {}
    for o in gc.get_objects():
        if isinstance(o, graphed.GraphedProgram):
            storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in o.pool_results}
            held[o.phase] = held.get(o.phase, 0.0) + sum(storages.values()) / MB
            held[o.phase + "_programs"] = held.get(o.phase + "_programs", 0) + 1
    return held


def steps_peak(model, x, params, steps: int) -> float:
    step = sizes.step_fn(model, (x,), params)
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / MB


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--H", type=int, default=4096)
    parser.add_argument("--act", default="swiglu")
    parser.add_argument("--T", nargs="*", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--fraction", type=float, help="graphed.MEMORY_FRACTION (the idle graphs' budget)")
    args = parser.parse_args()
    if args.fraction is not None:
        graphed.MEMORY_FRACTION = args.fraction
    torch.manual_seed(0)
    model = sizes.fuseops_dense(args.H, args.act).cuda().bfloat16()
    reference = sizes.torch_dense(model).cuda().bfloat16()
    params = list(model.parameters())
    print(f"{args.act} H={args.H}: parameters {sum(p.numel() * p.element_size() for p in params) / MB:.0f} MiB, "
          f"allocated at the start {torch.cuda.memory_allocated() / MB:.0f} MiB; idle graphs' budget "
          f"{graphed.budget(torch.device('cuda', torch.cuda.current_device())) / MB:.0f} MiB")
    for T in args.T:
        x = torch.randn(T, args.H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        counts = dict(graphed.counts)
        fuse_peak = steps_peak(model, x, params, 40)
        gc.collect()
        allocated = torch.cuda.memory_allocated() / MB
        decided = {k: graphed.counts[k] - v for k, v in counts.items() if graphed.counts[k] != v}
        torch_peak = steps_peak(reference, x, list(reference.parameters()), 5)
        print(f"T={T}: fuseops step peak {fuse_peak:.0f} MiB above resident, torch eager {torch_peak:.0f}; "
              f"allocated after fuseops' steps {allocated:.0f} MiB; graphs hold {graphs_held()}; {decided}", flush=True)
        del x
    gc.collect()
    print(f"end: allocated {torch.cuda.memory_allocated() / MB:.0f} MiB, graphs hold {graphs_held()}")


if __name__ == "__main__":
    main()
