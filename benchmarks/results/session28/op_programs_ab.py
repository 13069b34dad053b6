"""Session 28: our custom operators with and without recorded programs (``op_programs.py``), A/B on
one machine: a compiled MoE step at T=1024 (Qwen3, OLMoE), fuseops under ``torch.compile`` with
``custom_op.calling`` off (each operator's implementation: the launcher's Python every call) and on,
interleaved, beside ``torch.compile`` of the torch layer; step and enqueue ms, and the operators'
host time per step (each operator call timed, device drained before each step).

    python benchmarks/results/session28/op_programs_ab.py [moe:qwen3:1024] ...
"""
import collections
import sys
import time

import torch

from benchmarks import sizes
from fuseops.kernels import custom_op
from fuseops.ops.executor import op_programs

REPS, ROUNDS = 20, 3
spent: dict[str, float] = collections.defaultdict(float)


def timed(through):
    def calling(name, impl, args):
        start = time.perf_counter()
        try:
            return impl(*args) if through is None else through(name, impl, args)
        finally:
            spent[name] += time.perf_counter() - start
    return calling


cells = sys.argv[1:] or ["moe:qwen3:1024", "moe:olmoe:1024"]
variants = {"ops as they are": None, "ops through programs": op_programs.call}
print("| cell | variant | step ms | enqueue ms | operators' host us a step |")
print("| --- | --- | --- | --- | --- |")
for cell in cells:
    _, shape, T = cell.split(":")
    E, H, F, K = sizes.MOE_SHAPES[shape]
    torch.manual_seed(0)
    mine = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
    theirs = sizes.TorchMoE(mine).cuda().bfloat16()
    args = sizes.moe_args(int(T), E, H, K)
    ours = sizes.step_fn(torch.compile(mine), args, list(mine.parameters()))
    torch_step = sizes.step_fn(torch.compile(theirs), args, list(theirs.parameters()))
    results = collections.defaultdict(list)
    for _ in range(ROUNDS):
        for name, through in variants.items():
            custom_op.calling = timed(through)
            for _ in range(sizes.WARMUP_STEPS):
                ours()
            spent.clear()
            enqueue = sizes.enqueue_ms(ours, "cuda", REPS)
            ops_us = sum(spent.values()) * 1e6 / REPS
            by_op = {k: v * 1e6 / REPS for k, v in spent.items()}
            results[name].append((sizes.time_ms(ours, "cuda", REPS), enqueue, ops_us, by_op))
        for _ in range(5):
            torch_step()
        results["torch.compile"].append((sizes.time_ms(torch_step, "cuda", REPS), sizes.enqueue_ms(torch_step, "cuda", REPS), 0.0, {}))
    for name, rows in results.items():
        step, enq, ops_us = (min(r[i] for r in rows) for i in range(3))
        print(f"| {cell} | {name} | {step:.2f} | {enq:.2f} | {ops_us:.0f} |", flush=True)
    for name in variants:
        by_op = results[name][-1][3]
        print(f"  {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])))
    custom_op.calling = op_programs.call
for name in ("grouped_gemm_gated", "grouped_gemm_wgrad", "permute"):
    for program in list(op_programs.programs(name).values())[:1]:
        print(f"\n{name}:\n{getattr(program, 'source', program)}")
