"""Session 30: the compiled MoE composition with the routing's calls as graph-state operators
(``fuseops/moe/routing_ops.py``) against the same model with the routing traced as the kernels'
own operators (the code before session 30: ``routing_ops.traced`` patched back to the traceable
bodies), and ``torch.compile`` of the torch layer, in one process, interleaved rounds.

    python benchmarks/results/session30/compiled_routing_ab.py [T] [shapes...]

Prints per cell the step ms and enqueue ms of each variant and the ratios against torch.compile.
"""
import contextlib
import sys

import torch

from benchmarks import sizes
from fuseops.moe import routing_ops
from fuseops.ops.executor import graphed

ROUNDS, REPS = 3, 20


def _before(name, inputs, static=()):
    # What the traced calls ran before session 30: the bodies, whose kernels' own ops the trace records.
    if name == "permute":
        return routing_ops.traceable.permute(*inputs, *static)
    body = {"permute_backward": routing_ops.sum_rows, "unpermute": routing_ops.unpermute_plain,
            "unpermute_backward": routing_ops.unpermute_backward}[name]
    return body(*inputs)


@contextlib.contextmanager
def routing(old: bool):
    saved = routing_ops.traced
    routing_ops.traced = _before if old else saved
    try:
        yield
    finally:
        routing_ops.traced = saved


def variant(step, old):
    def run():
        with routing(old):
            step()
    return run


def main() -> None:
    T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    shapes = sys.argv[2:] or ["qwen3", "olmoe"]
    for shape in shapes:
        E, H, F, K = sizes.MOE_SHAPES[shape]
        for skewed in (False, True):
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = sizes.FuseopsMoE(E, H, F).cuda().bfloat16()
            reference = sizes.TorchMoE(model).cuda()
            args = sizes.moe_args(T, E, H, K, skewed)
            fparams, tparams = list(model.parameters()), list(reference.parameters())
            steps = {
                "routing ops (new)": variant(sizes.step_fn(torch.compile(model), args, fparams), False),
                "kernel ops (before)": variant(sizes.step_fn(torch.compile(model), args, fparams), True),
                "torch.compile": sizes.step_fn(torch.compile(reference), args, tparams),
            }
            for step in steps.values():
                for _ in range(sizes.WARMUP_STEPS):
                    step()
            best = {}
            for _ in range(ROUNDS):
                for name, step in steps.items():
                    ms, enq = sizes.time_ms(step, "cuda", REPS), sizes.enqueue_ms(step, "cuda", REPS)
                    old = best.get(name, (ms, enq))
                    best[name] = (min(ms, old[0]), min(enq, old[1]))
            torch_ms = best["torch.compile"][0]
            cells = ", ".join(f"{name} {ms:.2f} ms ({torch_ms / ms:.2f}x) enq {enq:.2f}" for name, (ms, enq) in best.items())
            print(f"{shape} T={T} {'skewed' if skewed else 'uniform'}: {cells}", flush=True)
    print("graph counts", graphed.counts)


if __name__ == "__main__":
    main()
