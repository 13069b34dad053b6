"""The distributed checks on NCCL, one GPU per rank; prints the worst relative error of
every compared tensor against the single-process float64 model.

    torchrun --nproc-per-node 2 tests/distributed/run_nccl.py      # from the repo root
    python3 tests/distributed/run_nccl.py                          # spawns one rank per GPU (2)
    python3 tests/distributed/run_nccl.py --backend gloo           # the same on CPU

Exits non-zero if any check fails on any rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from tests.distributed.launch import Report, free_port, init_rank  # noqa: E402
from tests.helpers import DTYPES  # noqa: E402


def checks():
    from tests.moe.test_expert_parallel import check_dispatch_roundtrip, check_expert_parallel_moe
    from tests.moe.test_expert_parallel_capacity import (
        check_capacity_drop,
        check_capacity_errors,
        check_capacity_moe,
        check_capacity_roundtrip,
    )
    from tests.moe.test_expert_parallel_overlap import check_pieces_moe, check_pieces_roundtrip
    from tests.ops.parallel.test_comm import check_comm_ops
    from tests.ops.parallel.test_tensor_parallel import check_tensor_parallel
    from tests.ops.parallel.test_tensor_parallel_quantized import check_quantized_tensor_parallel

    return [check_comm_ops, check_tensor_parallel, check_quantized_tensor_parallel, check_dispatch_roundtrip,
            check_expert_parallel_moe, check_capacity_roundtrip, check_capacity_moe, check_capacity_drop,
            check_capacity_errors, check_pieces_roundtrip, check_pieces_moe]


def run_all(device: torch.device) -> bool:
    """Every check on this rank; rank 0 prints the table. True when all passed everywhere."""
    rank = dist.get_rank()
    failures = []
    report = Report()
    for check in checks():
        start = time.perf_counter()
        try:
            check(device, DTYPES, report)
            status = "ok"
        except Exception:
            status = "FAILED"
            failures.append(f"rank {rank} {check.__name__}:\n{traceback.format_exc()}")
        dist.barrier()
        if rank == 0:
            print(f"{check.__name__:<32} {status:<7} {time.perf_counter() - start:6.2f} s", flush=True)
    for failure in failures:
        print(failure, file=sys.stderr, flush=True)
    ok = torch.tensor([0 if failures else 1], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(f"\n{dist.get_world_size()} ranks, backend {dist.get_backend()}, {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}")
        print(f"{'compared tensor (rank 0)':<58} {'dtype':<9} {'max rel err':>11}")
        for (what, dtype), err in sorted(report.rows.items()):
            print(f"{what:<58} {dtype:<9} {err:11.2e}")
        print("ALL PASSED" if ok.item() else "SOME CHECKS FAILED")
    return bool(ok.item())


def _spawned(rank: int, backend: str, world_size: int, port: int) -> None:
    device = init_rank("cuda" if backend == "nccl" else "cpu", rank, rank, world_size, f"tcp://127.0.0.1:{port}")
    try:
        ok = run_all(device)
    finally:
        dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--nproc", type=int, default=2, help="ranks to spawn when not under torchrun")
    args = parser.parse_args()
    if "RANK" in os.environ:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
        device_type = "cuda" if args.backend == "nccl" else "cpu"
        device = init_rank(device_type, rank, local_rank, int(os.environ["WORLD_SIZE"]), "env://")
        try:
            ok = run_all(device)
        finally:
            dist.destroy_process_group()
        raise SystemExit(0 if ok else 1)
    if args.backend == "nccl" and torch.cuda.device_count() < args.nproc:
        raise SystemExit(f"--backend nccl with {args.nproc} ranks needs {args.nproc} GPUs, found {torch.cuda.device_count()}")
    mp.spawn(_spawned, args=(args.backend, args.nproc, free_port()), nprocs=args.nproc)


if __name__ == "__main__":
    main()
