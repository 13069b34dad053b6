"""Megatron-style tensor parallelism with fuseops: a pre-norm MLP block split over the
ranks (column-parallel Linear, GELU, row-parallel Linear), loaded from the same weights
as a single-process block and trained a few steps beside it; the losses must agree.

    torchrun --nproc-per-node 2 examples/tensor_parallel.py
    torchrun --nproc-per-node 2 examples/tensor_parallel.py --sequence-parallel

NCCL with one GPU per rank (bf16) when CUDA is present, gloo on CPU (float32) otherwise.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import fuseops
import fuseops.distributed
from fuseops import ops


def block(hidden: int, ffn: int, group: dist.ProcessGroup | None = None, sequence_parallel: bool = False) -> fuseops.Sequential:
    """``y = x + W2 gelu(W1 rmsnorm(x))``; the residual arrives as an extra input."""
    tp = {} if group is None else {"tensor_parallel_group": group, "sequence_parallel": sequence_parallel}
    return fuseops.Sequential(
        ops.RMSNorm(hidden),
        ops.Linear(hidden, ffn, tensor_parallel_mode="column" if tp else None, **tp),
        ops.GELU(approximate="tanh"),
        ops.Linear(ffn, hidden, tensor_parallel_mode="row" if tp else None, **tp),
        ops.AddExtraInput(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if "RANK" not in os.environ:
        raise SystemExit("run with torchrun, e.g. torchrun --nproc-per-node 2 examples/tensor_parallel.py")

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    seq, batch, hidden, ffn = (2048, 4, 1024, 4096) if cuda else (16, 2, 64, 256)
    sp = args.sequence_parallel

    # Every rank builds the same single-process block (same seed) as the reference.
    torch.manual_seed(0)
    reference = block(hidden, ffn).to(device, dtype)
    parallel = block(hidden, ffn, group, sp).to(device, dtype)
    parallel.load_state_dict(fuseops.distributed.shard_state_dict(reference.state_dict(), parallel))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, parallel)]

    # Sequence-first activations: with sequence parallelism each rank holds seq / P rows.
    rows = slice(rank * seq // world, (rank + 1) * seq // world) if sp else slice(None)
    gen = torch.Generator(device=device).manual_seed(1)
    data = [
        (torch.randn(seq, batch, hidden, device=device, dtype=dtype, generator=gen),
         torch.randn(seq, batch, hidden, device=device, dtype=torch.float32, generator=gen))
        for _ in range(args.steps)
    ]

    if rank == 0:
        print(f"{world} ranks, {dist.get_backend()}, {dtype}, seq={seq} batch={batch} hidden={hidden} ffn={ffn}, sequence_parallel={sp}")
    worst, times = 0.0, []
    for step, (x, target) in enumerate(data):
        loss_ref = torch.nn.functional.mse_loss(reference(x, x).float(), target)
        opts[0].zero_grad(set_to_none=True)
        loss_ref.backward()
        opts[0].step()

        start = time.perf_counter()
        xl = x[rows]
        # The local share of the global mean, so that the ranks' gradients add up to it.
        loss = (parallel(xl, xl).float() - target[rows]).square().sum() / target.numel()
        opts[1].zero_grad(set_to_none=True)
        loss.backward()
        if sp:
            # The norm's weight is replicated but sees only this rank's rows: sum its
            # gradient over the group (Megatron does the same for every such parameter).
            dist.all_reduce(parallel[0].weight.grad, group=group)
        opts[1].step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)

        total = loss.detach().clone()
        if sp:
            dist.all_reduce(total, group=group)
        diff = abs(total.item() - loss_ref.item()) / abs(loss_ref.item())
        worst = max(worst, diff)
        if rank == 0:
            print(f"step {step}: loss single {loss_ref.item():.6f}  tensor-parallel {total.item():.6f}")
    if rank == 0:
        print(f"plan: {parallel.plan.forward}")
        steady = times[1:] or times
        print(f"tensor-parallel step {sum(steady) / len(steady) * 1e3:.1f} ms; largest relative loss difference {worst:.2e}")
    dist.destroy_process_group()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    if worst > tol:
        raise SystemExit(f"rank {rank}: tensor-parallel and single-process training diverged ({worst:.2e} > {tol:.0e})")
    if rank == 0:
        print("OK: tensor-parallel and single-process training agree")


if __name__ == "__main__":
    main()
