"""The public namespaces list exactly their API, and public functions that answer for one
another take the same arguments."""

from __future__ import annotations

import importlib
import inspect
import sys

import pytest
import torch

import fuseops
from fuseops import ops

NAMESPACES = [
    "fuseops.ops",
    "fuseops.moe",
    "fuseops.quant",
    "fuseops.quant.recipes",
    "fuseops.quant.autocast",
    "fuseops.fusions",
    "fuseops.integrations",
    "fuseops.integrations.transformers",
    "fuseops.distributed",
    "fuseops.testing",
]


@pytest.mark.parametrize("name", NAMESPACES)
def test_public_names_are_the_modules_all(name):
    module = importlib.import_module(name)
    public = {n for n in dir(module) if not n.startswith("_")}
    assert public == set(module.__all__), (sorted(public - set(module.__all__)), sorted(set(module.__all__) - public))
    for n in module.__all__:
        getattr(module, n)


def test_recipes_namespace_is_the_recipes_api():
    public = {n for n in dir(fuseops.recipes) if not n.startswith("_")}
    assert {"FP8CurrentScaling", "FP8Blockwise", "MXFP8", "NVFP4", "Recipe"} <= public
    assert not public & {"torch", "enum", "abc", "dataclass", "field", "annotations", "ClassVar"}


def test_submodules_stay_importable_though_not_listed():
    import fuseops.moe.routing
    import fuseops.ops.linear

    assert "linear" not in dir(fuseops.ops) and fuseops.ops.linear is sys.modules["fuseops.ops.linear"]
    assert "routing" not in dir(fuseops.moe) and fuseops.moe.routing is sys.modules["fuseops.moe.routing"]


def test_expert_layer_fallback_takes_expert_layers_arguments():
    params = list(inspect.signature(fuseops.moe.expert_layer).parameters.values())
    assert list(inspect.signature(fuseops.moe.expert_layer_fallback).parameters.values()) == params
    assert [p.name for p in params] == ["x", "expert_ids", "weights", "experts", "lean"]


E, H, F, T, K = 2, 16, 8, 5, 2


def _experts(gate=None, fc2_bias=False, fuse=True):
    gate = ops.SwiGLU(scaled=True) if gate is None else gate
    fc1_out = 2 * F if isinstance(gate, ops.GatedActivation) else F
    return fuseops.Sequential(ops.GroupedLinear(E, H, fc1_out), gate, ops.GroupedLinear(E, F, H, bias=fc2_bias),
                              fuse=fuse)


def _hooked():
    experts = _experts()
    experts.register_forward_hook(lambda *args: None)
    return experts


CASES = {
    "fused": (_experts, False, None),
    "fused lean": (_experts, True, None),
    "ungated": (lambda: _experts(ops.GELU()), False, None),
    "FC2 bias": (lambda: _experts(fc2_bias=True), False, None),
    "fuse=False": (lambda: _experts(fuse=False), False, None),
    "hooks": (_hooked, False, None),
    "fused under a recipe": (_experts, False, fuseops.recipes.FP8CurrentScaling()),
    "lean under a recipe": (_experts, True, fuseops.recipes.FP8CurrentScaling()),
}


@pytest.mark.parametrize("case", CASES)
def test_expert_layer_fallback_says_what_expert_layer_does(case, monkeypatch):
    """``expert_layer_fallback`` answers None exactly where ``expert_layer``, given the same
    arguments, runs its own Function instead of ``permute -> experts -> unpermute``."""
    make, lean, recipe = CASES[case]
    torch.manual_seed(0)
    experts = make()
    x, ids, w = torch.randn(T, H), torch.randint(0, E, (T, K)), torch.rand(T, K)
    layer_module = sys.modules["fuseops.moe.expert_layer"]
    composed = []
    permute_checked = layer_module.permute_checked
    monkeypatch.setattr(layer_module, "permute_checked", lambda *a: composed.append(1) or permute_checked(*a))
    with fuseops.autocast(recipe=recipe):
        reason = fuseops.moe.expert_layer_fallback(x, ids, w, experts, lean=lean)
        y = fuseops.moe.expert_layer(x, ids, w, experts, lean=lean)
    assert y.shape == (T, H)
    assert (reason is None) == (not composed), (reason, composed)
    assert (reason is None) == case.startswith("fused"), reason


@pytest.mark.parametrize("bad", ["ids shape", "weights shape", "features"])
def test_expert_layer_fallback_refuses_what_expert_layer_refuses(bad):
    experts = _experts()
    x, ids, w = torch.randn(T, H), torch.randint(0, E, (T, K)), torch.rand(T, K)
    args = {"ids shape": (x, ids[:, :, None], w), "weights shape": (x, ids, w[:, :1]),
            "features": (x[:, :-1], ids, w)}[bad]
    with pytest.raises(ValueError) as fallback_error:
        fuseops.moe.expert_layer_fallback(*args, experts)
    with pytest.raises(ValueError) as layer_error:
        fuseops.moe.expert_layer(*args, experts)
    assert str(fallback_error.value) == str(layer_error.value)
