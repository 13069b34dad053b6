"""The distributed checks on NCCL, 2 ranks with one GPU each (skipped with fewer GPUs).
``tests/distributed/run_nccl.py`` runs the same checks under torchrun and prints errors."""

import pytest
import torch

from tests.distributed.launch import run_on_ranks
from tests.distributed.run_nccl import checks
from tests.helpers import DTYPES


@pytest.mark.gpu
@pytest.mark.parametrize("check", checks(), ids=lambda c: c.__name__)
def test_on_two_gpus_with_nccl(check):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    run_on_ranks(check, 2, DTYPES, device_type="cuda")
