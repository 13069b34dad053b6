"""The quantized weight cache (``fuseops/ops/_quantized.py`` over ``fuseops.quant.weight_cache``)
in Linear, GroupedLinear and the fused expert MLP under every recipe.

One model is trained through a sequence of micro-batches and weight changes twice, with
``cache_weights=True`` and ``False``; outputs, input and weight gradients after every
micro-batch must agree bit for bit (a stale quantized weight would change them, as every
change writes new values). Quantizations are counted by wrapping the build: one per weight
and weight version with the cache, one per weight and micro-batch without it.
"""

import dataclasses
import functools

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.ops import _quantized
from fuseops.quant import recipes, weight_cache
from tests.helpers import assert_bitwise

RECIPES = [recipes.FP8CurrentScaling(), recipes.FP8Blockwise(), recipes.MXFP8(), recipes.NVFP4()]
IDS = [type(r).__name__ for r in RECIPES]
MICRO_BATCHES = 2
ROWS, SPLIT = 48, [16, 0, 32]


def _linear():
    return fuseops.Sequential(ops.Linear(64, 32, bias=True)), []


def _grouped():
    return fuseops.Sequential(ops.GroupedLinear(3, 64, 32, bias=True)), [SPLIT]


def _expert_mlp():
    # GroupedLinear -> scaled SwiGLU -> GroupedLinear: ForwardQuantizedGroupedMLP under MXFP8
    # and NVFP4, the unfused quantized ops under FP8.
    model = fuseops.Sequential(ops.GroupedLinear(3, 64, 64), ops.SwiGLU(scaled=True), ops.GroupedLinear(3, 32, 32))
    return model, [SPLIT, torch.rand(ROWS), SPLIT]


MODELS = {"Linear": _linear, "GroupedLinear": _grouped, "expert_mlp": _expert_mlp}


class CountedBuilds:
    """Wraps ``_quantized._quantize_weight`` (the cache's build) and counts its calls."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = _quantized._quantize_weight

        @functools.wraps(original)
        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(_quantized, "_quantize_weight", counted)


def _weights(model):
    return [p for name, p in model.named_parameters() if name.endswith("weight")]


def _sgd(model):
    torch.optim.SGD(model.parameters(), lr=0.5).step()


def _fused_adam(model):
    # torch's fused Adam does not bump the parameters' version counters.
    torch.optim.Adam(model.parameters(), lr=0.05, fused=True).step()


def _replace_data_twice(model):
    # The second new storage tends to land where the first one was: same address, same version.
    for p in model.parameters():
        p.data = torch.randn_like(p)
        p.data = torch.randn_like(p)


def _load_state_dict(model):
    model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})


def _to_bfloat16(model):
    model.to(torch.bfloat16)


def _fsdp_reshard(model):
    """FSDP2's pattern: every parameter a view of one flat buffer (a new Parameter made from
    the view shares the buffer's version counter); after the forward the buffer's storage is
    freed (resize_ to 0), before the next one re-allocated and re-filled by an all-gather."""
    params = list(model.named_parameters())
    flat = torch.cat([p.detach().reshape(-1) for _, p in params])
    start = 0
    for name, p in params:
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        view = flat[start : start + p.numel()].view_as(p)
        setattr(module, attr, torch.nn.Parameter(view))
        start += p.numel()
    model._fsdp_flat = flat


def _fsdp_regather(model):
    flat = model._fsdp_flat
    new_values = torch.randn(flat.shape, dtype=flat.dtype)
    storage = flat.untyped_storage()
    nbytes = storage.nbytes()
    storage.resize_(0)
    storage.resize_(nbytes)
    flat.copy_(new_values)


# Each change writes new weight values; the micro-batches after it must see them.
CHANGES = {
    "optimizer step": _sgd,
    "fused Adam step": _fused_adam,
    "param.data = twice": _replace_data_twice,
    "load_state_dict": _load_state_dict,
    ".to(bfloat16)": _to_bfloat16,
    "FSDP re-shard into views": _fsdp_reshard,
    "FSDP free and re-gather": _fsdp_regather,
}


def _micro_batches(model, extras, recipe, dtype, seed):
    records = []
    for i in range(MICRO_BATCHES):
        g = torch.Generator().manual_seed(seed * 100 + i)
        x = torch.randn(ROWS, 64, generator=g).to(dtype).requires_grad_()
        dy = torch.randn(ROWS, 32, generator=g).to(dtype)
        with fuseops.autocast(recipe=recipe):
            y = model(x, *extras)
        y.backward(dy)
        records += [y.detach(), x.grad] + [p.grad.clone() for p in model.parameters()]
    return records


def _train(make, recipe, monkeypatch):
    torch.manual_seed(0)
    model, extras = make()
    builds = CountedBuilds(monkeypatch)
    records, dtype, counts = [], torch.float32, []
    for step, change in enumerate([None, *CHANGES.values()]):
        if change is not None:
            change(model)
            model.zero_grad(set_to_none=True)
        dtype = next(model.parameters()).dtype
        before = builds.calls
        records += _micro_batches(model, extras, recipe, dtype, step)
        counts.append(builds.calls - before)
    return records, counts, len(_weights(model))


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
@pytest.mark.parametrize("model_name", list(MODELS))
def test_bitwise_equal_to_no_cache_and_one_quantization_per_weight_version(recipe, model_name, monkeypatch):
    weight_cache.clear()
    cached, cached_counts, weights = _train(MODELS[model_name], recipe, monkeypatch)
    uncached, uncached_counts, _ = _train(MODELS[model_name], dataclasses.replace(recipe, cache_weights=False), monkeypatch)
    assert len(cached) == len(uncached)
    for i, (got, ref) in enumerate(zip(cached, uncached)):
        assert_bitwise(got, ref, f"record {i}")
    assert cached_counts == [weights] * (len(CHANGES) + 1), "one quantization per weight and weight version"
    assert uncached_counts == [weights * MICRO_BATCHES] * (len(CHANGES) + 1)
    weight_cache.clear()


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
def test_inference_reuses_the_training_copy_and_bytes_are_visible(recipe, monkeypatch):
    weight_cache.clear()
    model, extras = _expert_mlp()
    builds = CountedBuilds(monkeypatch)
    x = torch.randn(ROWS, 64, requires_grad=True)
    with fuseops.autocast(recipe=recipe):
        model(x, *extras).sum().backward()
    assert builds.calls == 2
    held = fuseops.weight_cache.cached_bytes()
    assert held > 0
    # A row-wise request is served by the copy that also holds the column-wise one.
    with torch.no_grad(), fuseops.autocast(recipe=recipe):
        y = model(x, *extras)
    assert builds.calls == 2 and fuseops.weight_cache.cached_bytes() == held
    with torch.no_grad(), fuseops.autocast(recipe=dataclasses.replace(recipe, cache_weights=False)):
        ref = model(x, *extras)
    assert_bitwise(y, ref, "output")
    del model
    assert fuseops.weight_cache.cached_bytes() == 0, "a freed model frees its cached weights"


@pytest.mark.parametrize("recipe", RECIPES, ids=IDS)
@pytest.mark.parametrize("grouped", [False, True], ids=["Linear", "GroupedLinear"])
def test_main_grad_and_megatron_style_copy_into_param_data(recipe, grouped, monkeypatch):
    """accumulate_into_main_grad: the optimizer steps float32 main weights, then copies them
    into ``param.data`` (no version bump); the step's hook invalidates the cache first."""
    weight_cache.clear()

    def run(r):
        torch.manual_seed(0)
        op = ops.GroupedLinear(3, 64, 32, accumulate_into_main_grad=True) if grouped else ops.Linear(
            64, 32, bias=False, accumulate_into_main_grad=True)
        op.weight.data = op.weight.data.to(torch.bfloat16)
        model, extras = fuseops.Sequential(op), ([SPLIT] if grouped else [])
        main = op.weight.detach().float().clone().requires_grad_()
        optimizer = torch.optim.SGD([main], lr=0.5)
        out = []
        for step in range(3):
            op.weight.main_grad = torch.zeros_like(main)
            for i in range(MICRO_BATCHES):
                g = torch.Generator().manual_seed(step * 10 + i)
                x = torch.randn(ROWS, 64, generator=g).to(torch.bfloat16).requires_grad_()
                with fuseops.autocast(recipe=r):
                    y = model(x, *extras)
                y.backward(torch.randn(ROWS, 32, generator=g).to(torch.bfloat16))
                out += [y.detach(), x.grad]
            out.append(op.weight.main_grad.clone())
            main.grad = op.weight.main_grad
            optimizer.step()
            op.weight.data.copy_(main.detach())
        return out

    builds = CountedBuilds(monkeypatch)
    cached = run(recipe)
    assert builds.calls == 3
    for i, (got, ref) in enumerate(zip(cached, run(dataclasses.replace(recipe, cache_weights=False)))):
        assert_bitwise(got, ref, f"record {i}")
    weight_cache.clear()


def test_recipes_take_cache_weights_keyword_only():
    for cls in recipes.RECIPES:
        assert cls().cache_weights is True
        off = cls(cache_weights=False)
        assert off != cls() and hash(off) != hash(cls())
        with pytest.raises(TypeError, match="cache_weights: expected True or False, got 1"):
            cls(cache_weights=1)
    assert recipes.FP8Blockwise(torch.float8_e4m3fn).grad_dtype == torch.float8_e4m3fn
