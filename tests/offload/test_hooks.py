"""Groups from fuseops.Sequential calls; module hooks only while a context is active."""

import threading

import torch
from torch.nn.modules import module as nn_module

from fuseops.offload import offload_activations
from tests.offload._models import fuseops_layers, mlp_layers


def global_hook_count():
    return len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)


def test_module_hooks_exist_only_inside_contexts():
    before = global_hook_count()
    with offload_activations():
        assert global_hook_count() == before + 2
        with offload_activations(enabled=False):
            assert global_hook_count() == before + 2
    assert global_hook_count() == before


def test_top_level_sequential_calls_are_groups_nested_ones_are_not():
    layers, x = fuseops_layers(n=4), torch.randn(8, 32, requires_grad=True)
    with offload_activations(min_tensor_bytes=0, group_budget_bytes=None) as handle:
        h = layers[0](x)
        with handle.group():
            h = layers[2](layers[1](h))
        h = layers[3](h)
    assert handle.stats["groups"] == 3


def test_sequential_inside_a_disabled_block_opens_no_group():
    layers, x = fuseops_layers(n=2), torch.randn(8, 32, requires_grad=True)
    with offload_activations(min_tensor_bytes=0, group_budget_bytes=None) as handle:
        h = layers[0](x)
        with offload_activations(enabled=False) as inner:
            h = layers[1](h)
    assert handle.stats["groups"] == 1
    assert inner.stats["skipped_disabled"] > 0


def test_a_sequential_that_raises_still_closes_its_group():
    layers = fuseops_layers(n=2)
    with offload_activations(min_tensor_bytes=0, group_budget_bytes=None) as handle:
        try:
            layers[0](torch.randn(8, 31))
        except (TypeError, ValueError):
            pass
        h = layers[0](torch.randn(8, 32, requires_grad=True))
        h = layers[1](h)
    assert handle.stats["groups"] == 2


def test_other_threads_are_not_offloaded():
    layers, x = mlp_layers(n=2), torch.randn(16, 32, requires_grad=True)
    results = {}

    def other():
        h = x
        for layer in layers:
            h = layer(h)
        results["y"] = h

    with offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None) as handle:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    results["y"].sum().backward()
    assert handle.stats["tensors_offloaded"] == handle.stats["tensors_skipped"] == 0
