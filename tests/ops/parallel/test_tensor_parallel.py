"""Column/row-parallel Linear (with and without sequence parallelism) on 2 and 4 gloo
ranks against the single-process model in float64: outputs, input, weight, bias and
residual gradients; sharded loading from a full state dict; bad configurations.
``check_tensor_parallel`` also runs on NCCL (tests/distributed/run_nccl.py)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import fuseops
import fuseops.distributed
from fuseops import ops
from tests.distributed.launch import Report, run_on_ranks
from tests.helpers import DTYPES

HIDDEN, SEQ_PER_RANK, BATCH = 8, 2, 3


def _mlp(group, ffn, dtype, device, *, sequence_parallel, bias):
    """Megatron's MLP: column-parallel Linear, GELU, row-parallel Linear, residual add."""
    tp = {"tensor_parallel_group": group, "sequence_parallel": sequence_parallel, "device": device, "dtype": dtype}
    return fuseops.Sequential(
        ops.Linear(HIDDEN, ffn, bias=bias, tensor_parallel_mode="column", **tp),
        ops.GELU(approximate="tanh"),
        ops.Linear(ffn, HIDDEN, bias=bias, tensor_parallel_mode="row", **tp),
        ops.AddExtraInput(),
    )


def check_tensor_parallel(device, dtypes, report: Report):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    ffn, seq = 3 * world, SEQ_PER_RANK * world
    for dtype in dtypes:
        for sequence_parallel in (False, True):
            for bias in (True, False):
                gen = torch.Generator().manual_seed(11)

                def full(*shape):
                    # Rounded to dtype first: the reference starts from what the ranks hold.
                    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).double()

                w1, b1, w2, b2 = full(ffn, HIDDEN), full(ffn), full(HIDDEN, ffn), full(HIDDEN)
                x, r, dy = full(seq, BATCH, HIDDEN), full(seq, BATCH, HIDDEN), full(seq, BATCH, HIDDEN)
                params64 = [t.clone().requires_grad_() for t in (w1, b1, w2, b2)]
                x64, r64 = x.clone().requires_grad_(), r.clone().requires_grad_()
                h64 = F.gelu(F.linear(x64, params64[0], params64[1] if bias else None), approximate="tanh")
                y64 = F.linear(h64, params64[2], params64[3] if bias else None) + r64
                y64.backward(dy)

                model = _mlp(group, ffn, dtype, device, sequence_parallel=sequence_parallel, bias=bias)
                state = {"0.weight": w1, "2.weight": w2} | ({"0.bias": b1, "2.bias": b2} if bias else {})
                model.load_state_dict(fuseops.distributed.shard_state_dict({k: v.to(dtype) for k, v in state.items()}, model))

                # With sequence parallelism every rank holds its slice of the sequence.
                rows = slice(SEQ_PER_RANK * rank, SEQ_PER_RANK * (rank + 1)) if sequence_parallel else slice(None)
                cols = slice(3 * rank, 3 * (rank + 1))
                xl, rl = (t[rows].to(device, dtype).requires_grad_() for t in (x, r))
                y = model(xl, rl)
                y.backward(dy[rows].to(device, dtype))
                assert [name for name, _ in model.plan.forward] == ["Linear", "GELU", "Linear", "AddExtraInput"]

                tag = f"MLP sp={sequence_parallel} bias={bias}"
                report.close(y, y64[rows], dtype, f"{tag} output", 4)
                report.close(xl.grad, x64.grad[rows], dtype, f"{tag} input grad", 4)
                report.close(rl.grad, r64.grad[rows], dtype, f"{tag} residual grad")
                column, row = model[0], model[2]
                report.close(column.weight.grad, params64[0].grad[cols], dtype, f"{tag} column weight grad", 4)
                report.close(row.weight.grad, params64[2].grad[:, cols], dtype, f"{tag} row weight grad", 4)
                if bias:
                    report.close(column.bias.grad, params64[1].grad[cols], dtype, f"{tag} column bias grad", 4)
                    report.close(row.bias.grad, params64[3].grad, dtype, f"{tag} row bias grad", 4)
    _check_errors(device)


def _check_errors(device):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    tp = {"tensor_parallel_group": group}
    with pytest.raises(ValueError, match=rf"out_features: expected a multiple of the tensor-parallel group size {world} .*'column', got {3 * world + 1}"):
        ops.Linear(8, 3 * world + 1, tensor_parallel_mode="column", **tp)
    with pytest.raises(ValueError, match=rf"in_features: expected a multiple of the tensor-parallel group size {world} .*'row', got {3 * world + 1}"):
        ops.Linear(3 * world + 1, 8, tensor_parallel_mode="row", **tp)

    row = ops.Linear(2 * world, 4, tensor_parallel_mode="row", device=device, **tp)
    with pytest.raises(ValueError, match=rf"expected shape \[\.\.\., 2\] \({2 * world} in_features split over {world} ranks\), got \[5, {2 * world}\]"):
        fuseops.Sequential(row)(torch.randn(5, 2 * world, device=device))
    row_sp = ops.Linear(2 * world, 4, tensor_parallel_mode="row", sequence_parallel=True, device=device, **tp)
    with pytest.raises(ValueError, match=rf"first dim divisible by the group size {world}, got shape \[{world + 1}, 2\]"):
        fuseops.Sequential(row_sp)(torch.randn(world + 1, 2, device=device))
    with pytest.raises(ValueError, match="sequence_parallel=True, got shape \\[2\\]"):
        fuseops.Sequential(row_sp)(torch.randn(2, device=device))

    column = ops.Linear(4, 2 * world, tensor_parallel_mode="column", device=device, **tp)
    with pytest.raises(ValueError, match=rf"full_state\['weight'\]: expected the full shape \[{2 * world}, 4\] .* got \[{2 * world}, 5\]"):
        fuseops.distributed.shard_state_dict({"weight": torch.zeros(2 * world, 5), "bias": torch.zeros(2 * world)}, column)

    only_rank0 = dist.new_group([0])
    if rank != 0:
        with pytest.raises(ValueError, match="tensor_parallel_group: this rank is not a member"):
            ops.Linear(4, 4, tensor_parallel_mode="column", tensor_parallel_group=only_rank0)
    if world == 4:
        # A column-parallel Linear on a pair of ranks feeding a row-parallel one on all four.
        pair, _ = dist.new_subgroups(group_size=2)
        model = fuseops.Sequential(
            ops.Linear(4, 8, tensor_parallel_mode="column", tensor_parallel_group=pair, device=device),
            ops.Linear(8, 4, tensor_parallel_mode="row", device=device, **tp),
        )
        with pytest.raises(ValueError, match=r"expected shape \[\.\.\., 2\] \(8 in_features split over 4 ranks\), got \[3, 4\]"):
            model(torch.randn(3, 4, device=device))


@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_parallel_mlp_matches_single_process(world_size):
    run_on_ranks(check_tensor_parallel, world_size, DTYPES)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"tensor_parallel_mode": "diagonal", "tensor_parallel_group": None}, ValueError,
         "tensor_parallel_mode: expected None or one of 'column', 'row', got 'diagonal'"),
        ({"tensor_parallel_mode": "column"}, ValueError,
         "tensor_parallel_group: expected a torch.distributed ProcessGroup with tensor_parallel_mode='column', got None"),
        ({"tensor_parallel_mode": "row", "tensor_parallel_group": "world"}, TypeError,
         "tensor_parallel_group: expected a torch.distributed ProcessGroup"),
        ({"tensor_parallel_group": object()}, ValueError,
         "tensor_parallel_group: expected tensor_parallel_mode 'column' or 'row' with it, got None"),
        ({"sequence_parallel": True}, ValueError,
         "sequence_parallel=True: expected tensor_parallel_mode 'column' or 'row' with it, got None"),
    ],
)
def test_bad_tensor_parallel_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ops.Linear(4, 4, **kwargs)


def test_unsharded_linear_is_unchanged():
    op = ops.Linear(6, 4)
    assert op.tensor_parallel is None and op.local_gemm
    assert op.weight.shape == (4, 6) and op.bias.shape == (4,)
    assert fuseops.distributed.shard_state_dict(op.state_dict(), op).keys() == op.state_dict().keys()
