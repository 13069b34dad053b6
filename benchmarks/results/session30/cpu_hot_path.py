"""Session 30 (no device time): the changed hot paths where a CPU user starts, against the tree
before the change (run this file from each checkout, in alternation): the MoE layer at a small
and a medium size as ``fuseops.moe.expert_layer`` and as the composition (permute, experts,
unpermute), eager and under ``torch.compile``, float32 parameters plain and under
``torch.autocast(cpu, bfloat16)``. Median ms of a forward+backward step.

    PYTHONPATH=<checkout> python3 benchmarks/results/session30/cpu_hot_path.py [steps] [sizes...]
"""
import statistics
import sys
import time

import torch

from benchmarks import sizes

SIZES = {"small": (8, 64, 32, 2, 64), "medium": (16, 256, 128, 4, 512)}  # E, H, F, K, T
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
torch.set_num_threads(1)
for size in sys.argv[2:] or SIZES:
    E, H, F, K, T = SIZES[size]
    torch._dynamo.reset()
    torch.manual_seed(0)
    composition = sizes.FuseopsMoE(E, H, F)
    models = {"layer": sizes.FuseopsExpertLayer(composition), "composition": composition,
              "composition compiled": torch.compile(composition)}
    args = sizes.moe_args(T, E, H, K, device="cpu", dtype=torch.float32)
    params = list(composition.parameters())
    cells = []
    for autocast in (False, True):
        for name, model in models.items():
            step = sizes.step_fn(model, args, params)

            def run(step=step, autocast=autocast):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    step()
            for _ in range(5):
                run()
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            cells.append(f"{name}{' autocast' if autocast else ''} {statistics.median(times) * 1e3:.2f}")
    print(f"{size} E={E} H={H} F={F} K={K} T={T}: " + ", ".join(cells), flush=True)
