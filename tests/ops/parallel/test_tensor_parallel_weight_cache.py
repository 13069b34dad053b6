"""The quantized weight cache under tensor parallelism, on 2 gloo ranks: each rank caches
its local weight shard. Megatron's MLP (column Linear, GELU, row Linear), with and without
sequence parallelism, through micro-batches and an optimizer step: outputs and gradients
bit for bit those of ``cache_weights=False``, one quantization per shard and weight version."""

import dataclasses

import torch
import torch.distributed as dist

import fuseops
from fuseops import ops
from fuseops.ops import _quantized
from fuseops.quant import recipes, weight_cache
from tests.distributed.launch import Report, run_on_ranks
from tests.helpers import assert_bitwise

HIDDEN, FFN, SEQ, BATCH = 128, 256, 16, 2
RECIPES = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]


def _mlp(group, sequence_parallel):
    tp = {"tensor_parallel_group": group, "sequence_parallel": sequence_parallel}
    return fuseops.Sequential(
        ops.Linear(HIDDEN, FFN, tensor_parallel_mode="column", **tp), ops.GELU(approximate="tanh"),
        ops.Linear(FFN, HIDDEN, tensor_parallel_mode="row", **tp),
    )


def _train(model, recipe, rows, seed):
    records = []
    for step in range(2):
        for micro in range(2):
            g = torch.Generator().manual_seed(seed + 10 * step + micro)
            x = torch.randn(rows, BATCH, HIDDEN, generator=g).requires_grad_()
            with fuseops.autocast(recipe=recipe):
                y = model(x)
            y.backward(torch.randn(y.shape, generator=g))
            records += [y.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]
        torch.optim.SGD(model.parameters(), lr=0.5).step()
        model.zero_grad(set_to_none=True)
    return records


def check_weight_cache_per_shard(device, dtypes, report: Report):
    group, world, rank = dist.group.WORLD, dist.get_world_size(), dist.get_rank()
    calls = [0]
    original = _quantized._quantize_weight

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    _quantized._quantize_weight = counted
    try:
        for recipe in RECIPES:
            for sequence_parallel in (False, True):
                torch.manual_seed(0)
                model = _mlp(group, sequence_parallel)
                uncached_model = _mlp(group, sequence_parallel)
                uncached_model.load_state_dict(model.state_dict())
                rows = SEQ // world if sequence_parallel else SEQ
                weight_cache.clear()
                calls[0] = 0
                cached = _train(model, recipe, rows, 100 * rank)
                assert calls[0] == 2 * 2, f"{recipe} sp={sequence_parallel}: {calls[0]} quantizations"
                uncached = _train(uncached_model, dataclasses.replace(recipe, cache_weights=False), rows, 100 * rank)
                for i, (got, ref) in enumerate(zip(cached, uncached, strict=True)):
                    assert_bitwise(got, ref, f"{type(recipe).__name__} sp={sequence_parallel} record {i}")
    finally:
        _quantized._quantize_weight = original
        weight_cache.clear()


def test_weight_cache_per_local_shard():
    run_on_ranks(check_weight_cache_per_shard, 2, (torch.float32,))
