"""Column/row-parallel Linear under every recipe, with and without sequence parallelism,
on 2 gloo ranks.

Compared, after gathering every shard (outputs, input grads, weight grads):
- against float64 unquantized maths: one Linear per mode meets the SQNR floors of
  tests/ops/test_quantized.py; Megatron's MLP (column Linear, GELU, row Linear) meets
  them for its output and row weight grad, and 3 dB below them for the input and column
  weight grads, whose noise passes through both Linears' quantized backward (as it
  does in one process);
- against the same model run quantized in one process: the block-scaled recipes
  (FP8Blockwise, MXFP8) see the same blocks, as every shard is whole tiles, so they
  agree to float32 rounding; the per-tensor ones (FP8CurrentScaling, NVFP4) scale each
  rank's operand by its own amax, so they differ by quantization noise: no more than
  two independent quantizations would (the single-process SQNR less 3 dB).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fuseops
import fuseops.distributed
from fuseops import ops
from fuseops.ops.parallel.tensor_parallel import all_gather
from tests.distributed.launch import Report, run_on_ranks
from tests.helpers import assert_bitwise, sqnr_db
from tests.ops.test_quantized import FLOORS

# F / 2 = 256 features per rank: whole 128x128 tiles and 32- and 16-wide blocks.
HIDDEN, FFN, SEQ, BATCH = 256, 512, 64, 4
PER_TENSOR = ("FP8CurrentScaling", "NVFP4")
# Float32 rounding of the partial sums, well above any quantization noise.
SAME_BLOCKS_DB = 100.0
# (mode, sequence_parallel) -> (dims of the input split over ranks, dims of the output).
SPLITS = {
    ("column", False): ((), (-1,)),
    ("column", True): ((0,), (-1,)),
    ("row", False): ((-1,), ()),
    ("row", True): ((-1,), (0,)),
}


def _shard(t, dims, rank, world):
    for dim in dims:
        t = t.chunk(world, dim)[rank]
    return t


def _gather(t, dims, group):
    for dim in dims:
        t = all_gather(t.movedim(dim, 0).contiguous(), group).movedim(0, dim)
    return t


def _run(model, x, dy, recipe):
    x = x.detach().clone().requires_grad_()
    with fuseops.autocast(recipe=recipe):
        y = model(x)
    y.backward(dy)
    return y.detach(), x.grad


def _compare(got, ref64, single, recipe, floors, what):
    name = type(recipe).__name__
    db, single_db = sqnr_db(got, ref64), sqnr_db(single, ref64)
    assert db >= floors, f"{name} {what}: {db:.1f} dB < {floors} dB against float64"
    agree = sqnr_db(got, single)
    expected = single_db - 3.0 if name in PER_TENSOR else SAME_BLOCKS_DB
    assert agree >= expected, f"{name} {what}: {agree:.1f} dB < {expected:.1f} dB against one quantized process"


def _check_one_linear(group, world, rank, device, recipe, floors, gen):
    for (mode, sequence_parallel), (in_dims, out_dims) in SPLITS.items():
        w = torch.randn(FFN, HIDDEN, generator=gen) / HIDDEN**0.5
        x, dy = torch.randn(SEQ, BATCH, HIDDEN, generator=gen), torch.randn(SEQ, BATCH, FFN, generator=gen)
        w64, x64 = w.double().requires_grad_(), x.double().requires_grad_()
        (x64 @ w64.T).backward(dy.double())
        ref = {"output": x64 @ w64.T.detach(), "input grad": x64.grad, "weight grad": w64.grad}

        single = ops.Linear(HIDDEN, FFN, bias=False, device=device)
        single.load_state_dict({"weight": w})
        y1, dx1 = _run(single, x.to(device), dy.to(device), recipe)
        one = {"output": y1, "input grad": dx1, "weight grad": single.weight.grad}

        # Called directly: the op raised ValueError under a recipe before.
        linear = ops.Linear(HIDDEN, FFN, bias=False, tensor_parallel_mode=mode, tensor_parallel_group=group,
                            sequence_parallel=sequence_parallel, device=device)
        linear.load_state_dict(fuseops.distributed.shard_state_dict({"weight": w}, linear))
        xl, dyl = _shard(x, in_dims, rank, world).to(device), _shard(dy, out_dims, rank, world).to(device)
        y, dx = _run(linear, xl, dyl, recipe)
        got = {"output": _gather(y, out_dims, group), "input grad": _gather(dx, in_dims, group),
               "weight grad": _gather(linear.weight.grad, (0 if mode == "column" else 1,), group)}
        for (what, t), floor in zip(got.items(), floors):
            _compare(t.cpu(), ref[what], one[what].cpu(), recipe, floor, f"{mode} sp={sequence_parallel} {what}")


def _mlp_grads(y, dx, params):
    """By name: the output, the input grad and the grads of the MLP's parameters
    (column weight, column bias, row weight, row bias, in that order)."""
    names = ("column weight grad", "column bias grad", "row weight grad", "row bias grad")
    grads = {n: p.grad for n, p in zip(names, params, strict=True)}
    return {"output": y, "input grad": dx} | grads


def _mlp(tp=None):
    column, row = ({}, {}) if tp is None else ({"tensor_parallel_mode": m} | tp for m in ("column", "row"))
    return fuseops.Sequential(
        ops.Linear(HIDDEN, FFN, **column), ops.GELU(approximate="tanh"), ops.Linear(FFN, HIDDEN, **row)
    )


def _check_mlp(group, world, rank, device, recipe, floors, gen):
    full = {
        "0.weight": torch.randn(FFN, HIDDEN, generator=gen) / HIDDEN**0.5, "0.bias": torch.randn(FFN, generator=gen),
        "2.weight": torch.randn(HIDDEN, FFN, generator=gen) / FFN**0.5, "2.bias": torch.randn(HIDDEN, generator=gen),
    }
    x, dy = torch.randn(SEQ, BATCH, HIDDEN, generator=gen), torch.randn(SEQ, BATCH, HIDDEN, generator=gen)
    p64 = {k: v.double().requires_grad_() for k, v in full.items()}
    x64 = x.double().requires_grad_()
    h64 = F.gelu(F.linear(x64, p64["0.weight"], p64["0.bias"]), approximate="tanh")
    y64 = F.linear(h64, p64["2.weight"], p64["2.bias"])
    y64.backward(dy.double())

    ref = _mlp_grads(y64.detach(), x64.grad, p64.values())
    single = _mlp().to(device)
    single.load_state_dict(full)
    one = _mlp_grads(*_run(single, x.to(device), dy.to(device), recipe), single.parameters())
    out_floor, dx_floor, dw_floor = floors
    through_both = {"output": out_floor, "input grad": dx_floor - 3, "column weight grad": dw_floor - 3,
                    "row weight grad": dw_floor, "column bias grad": dx_floor - 3, "row bias grad": out_floor}
    for sequence_parallel in (False, True):
        model = _mlp({"tensor_parallel_group": group, "sequence_parallel": sequence_parallel, "device": device})
        model.load_state_dict(fuseops.distributed.shard_state_dict(full, model))
        rows = (0,) if sequence_parallel else ()
        xl, dyl = (_shard(t, rows, rank, world).to(device) for t in (x, dy))
        got = _mlp_grads(*_run(model, xl, dyl, recipe), model.parameters())
        got["output"], got["input grad"] = (_gather(got[k], rows, group) for k in ("output", "input grad"))
        for k, dim in (("column weight grad", 0), ("column bias grad", 0), ("row weight grad", 1)):
            got[k] = _gather(got[k], (dim,), group)
        for what, floor in through_both.items():
            _compare(got[what].cpu(), ref[what], one[what].cpu(), recipe, floor, f"MLP sp={sequence_parallel} {what}")
        _check_offload(model, xl, dyl, recipe)


def _check_offload(model, x, dy, recipe):
    """The quantized saved records offload (their column-wise copies are activations)
    and reload with gradients bit for bit those of the run without offloading."""
    model.zero_grad()
    _, dx = _run(model, x, dy, recipe)
    plain = [dx] + [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with fuseops.offload_activations(keep_last=0, min_tensor_bytes=0, group_budget_bytes=None) as offload:
        _, dx = _run(model, x, dy, recipe)
    assert offload.stats["tensors_offloaded"] > 0, offload.stats
    for i, (a, b) in enumerate(zip(plain, [dx] + [p.grad for p in model.parameters()])):
        assert_bitwise(b, a, f"{type(recipe).__name__} offloaded grad {i}")


def check_quantized_tensor_parallel(device, dtypes, report: Report):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    gen = torch.Generator().manual_seed(5)
    for recipe, *floors in FLOORS:
        _check_one_linear(group, world, rank, device, recipe, floors, gen)
        _check_mlp(group, world, rank, device, recipe, floors, gen)


def test_quantized_tensor_parallel_matches_float64_and_one_process():
    run_on_ranks(check_quantized_tensor_parallel, 2, (torch.float32,))
