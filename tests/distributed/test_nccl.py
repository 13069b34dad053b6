"""The distributed checks on NCCL: on 2 ranks with one GPU each (skipped with fewer GPUs), and
the expert-parallel checks on one GPU as a world-size-1 NCCL group (the same collectives,
streams and CUDA-graph capture, each rank sending to itself): values against the
single-process model, no host sync, a replayed CUDA graph, ``dispatch_chunks`` on a side
stream, and expert parallelism composed with tensor parallelism and FSDP2.
``tests/distributed/run_nccl.py`` runs the 2-rank checks under torchrun and prints errors."""

import pytest
import torch
import torch.distributed as dist

from tests.distributed.launch import run_on_ranks
from tests.distributed.run_nccl import checks
from tests.helpers import DTYPES


def one_gpu_checks():
    """(check, dtypes) pairs that hold on a group of one rank."""
    from tests.moe.test_expert_parallel import check_dispatch_roundtrip, check_expert_parallel_moe
    from tests.moe.test_expert_parallel_capacity import (
        GPU_CHECKS,
        check_capacity_drop,
        check_capacity_errors,
        check_capacity_moe,
        check_capacity_roundtrip,
    )
    from tests.moe.test_expert_parallel_composition import check_composition_trains
    from tests.moe.test_expert_parallel_overlap import GPU_CHECKS as PIECES_GPU_CHECKS
    from tests.moe.test_expert_parallel_overlap import check_pieces_moe, check_pieces_roundtrip

    values = (check_dispatch_roundtrip, check_expert_parallel_moe, check_capacity_roundtrip, check_capacity_moe,
              check_capacity_drop, check_capacity_errors, check_pieces_roundtrip, check_pieces_moe)
    # Three SGD steps against float64: float32 only (the other dtypes' rounding compounds).
    return ([(check, DTYPES) for check in values + GPU_CHECKS + PIECES_GPU_CHECKS]
            + [(check_composition_trains, (torch.float32,))])


@pytest.mark.gpu
@pytest.mark.parametrize("check", checks(), ids=lambda c: c.__name__)
def test_on_two_gpus_with_nccl(check):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    run_on_ranks(check, 2, DTYPES, device_type="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("check, dtypes", [pytest.param(c, d, id=c.__name__) for c, d in one_gpu_checks()])
def test_on_one_gpu_with_nccl(check, dtypes):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not dist.is_nccl_available():
        pytest.skip("needs torch built with NCCL")
    run_on_ranks(check, 1, dtypes, device_type="cuda")
