"""The scheduler's rules on CPU: what stays, views, dedup, versions, prefetch order."""

import pytest
import torch

from fuseops.offload import offload_activations
from fuseops.offload.link import HostLink
from tests.offload._models import mlp_layers, run_step


class SaveViews(torch.autograd.Function):
    """Saves several views of one storage; backward checks what comes back."""

    @staticmethod
    def forward(ctx, base, make_views):
        views = make_views(base)
        ctx.expected = [(v.shape, v.stride(), v.storage_offset(), v.clone()) for v in views]
        ctx.save_for_backward(*views)
        return base * 2

    @staticmethod
    def backward(ctx, dy):
        for i, (v, (shape, stride, offset, value)) in enumerate(zip(ctx.saved_tensors, ctx.expected)):
            assert (v.shape, v.stride(), v.storage_offset()) == (shape, stride, offset), f"view {i}"
            assert torch.equal(v, value), f"view {i}: values"
        return dy * 2, None


def odd_views(base):
    return [base, base[1:, 3:].t(), base[2], base.view(-1)[5:77:3], base[:, None, 1:4].expand(-1, 2, -1),
            base.view(torch.int32)[1:3]]


def test_views_are_restored_exactly_and_share_one_copy():
    base = torch.randn(16, 24).mul(3)
    x = base.clone().requires_grad_()
    with offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None) as handle:
        y = SaveViews.apply(x * 1, odd_views)
    y.sum().backward()
    stats = handle.stats
    assert stats["tensors_offloaded"] == len(odd_views(base))
    assert stats["storages_offloaded"] == 1
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] == base.numel() * 4


def test_parameters_views_of_them_and_buffers_stay():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(64, 64))
            self.register_buffer("scale", torch.randn(64, 64))

        def forward(self, h):
            return (h @ self.weight.t()) * self.scale + torch.mm(h, self.weight[:, :64])

    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(64, 64, requires_grad=True)
    with offload_activations(min_tensor_bytes=0, keep_last=0, group_budget_bytes=None) as handle:
        y = model(x * 1)
    stats = handle.stats
    assert stats["skipped_parameter"] == 2 and stats["skipped_buffer"] == 1
    # Only the activation (x * 1) moves, once for both products that saved it.
    assert stats["tensors_offloaded"] == 2 and stats["storages_offloaded"] == 1
    assert stats["bytes_offloaded"] == 64 * 64 * 4
    y.sum().backward()
    assert stats["bytes_offloaded"] == handle.stats["bytes_reloaded"]


def test_in_place_change_of_a_saved_tensor_on_the_device_raises_like_autograd():
    def forward(change_in_next_group, keep_last):
        x = torch.randn(64, 64, requires_grad=True, generator=torch.Generator().manual_seed(0))
        with offload_activations(min_tensor_bytes=0, keep_last=keep_last, group_budget_bytes=None) as handle:
            with handle.group():
                h = x * 1
                y = h.sin()
            with handle.group():
                if change_in_next_group:
                    h.add_(1)
                y = y * x
        return x, h, y

    # Kept on the device, or changed while its copy out may still be running.
    for change_in_next_group, keep_last in ((False, 2), (True, 1)):
        x, h, y = forward(change_in_next_group, keep_last)
        h.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    # Changed after its copy settled: backward sees the value the forward saved.
    x, h, y = forward(False, 0)
    h.add_(1)
    y.sum().backward()
    x0 = x.detach()
    assert torch.equal(x.grad, (x0.cos() * x0 + x0.sin()))


def test_a_storage_saved_by_two_groups_is_bitwise():
    """Each layer's sigmoid output is saved by it and by the next layer's first op."""
    torch.manual_seed(0)
    weights = [torch.randn(48, 48, requires_grad=True) for _ in range(4)]

    def step(offload):
        for w in weights:
            w.grad = None
        x = torch.randn(32, 48, generator=torch.Generator().manual_seed(1)).requires_grad_()
        with (offload_activations(min_tensor_bytes=0, **offload, group_budget_bytes=None) if offload is not None
              else torch.enable_grad()) as handle:
            h = x
            for w in weights:
                with handle.group() if offload is not None else torch.enable_grad():
                    h = (h * h @ w).sigmoid()
        h.sum().backward()
        return [h.detach(), x.grad] + [w.grad for w in weights], handle

    want, _ = step(None)
    for config in (dict(), dict(keep_last=0), dict(keep_last=2)):
        got, handle = step(config)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), config
        assert handle.stats["bytes_offloaded"] == handle.stats["bytes_reloaded"] > 0


def test_backward_prefetches_the_previous_group_inside_the_current_ones_backward(monkeypatch):
    """Group g-1 is reloaded while group g's backward runs: after g has consumed as many
    bytes as come back (or half of its own), before g-1's backward starts."""
    log = []
    copy_in = HostLink.copy_in

    def logged_copy_in(self, blocks, sizes, after):
        log.append(("reload", len(blocks)))
        return copy_in(self, blocks, sizes, after)

    class Mark(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, event):
            ctx.event = event
            return x.view_as(x)

        @staticmethod
        def backward(ctx, dy):
            log.append(ctx.event)
            return dy, None

    monkeypatch.setattr(HostLink, "copy_in", logged_copy_in)
    layers, x = mlp_layers(n=4), torch.randn(40, 32, requires_grad=True)
    with offload_activations(min_tensor_bytes=1024, group_budget_bytes=None) as handle:
        h = x
        for i, layer in enumerate(layers):
            with handle.group():
                h = h + Mark.apply(layer(Mark.apply(h, ("end", i))), ("start", i))
    h.sum().backward()
    # Layer 3 stays. Each layer saves four large storages (its input, the norm's output,
    # the GELU's input and output); layer 0's input is the leaf, which stays.
    assert [e for e in log if e[0] != "reload" or e[1] > 0] == [
        ("start", 3), ("reload", 4), ("end", 3), ("start", 2), ("reload", 4), ("end", 2),
        ("start", 1), ("reload", 3), ("end", 1), ("start", 0), ("end", 0)]


def test_retain_graph_runs_backward_twice_bitwise():
    layers, x = mlp_layers(n=3), torch.randn(40, 32)
    xr = x.clone().requires_grad_()
    with offload_activations(min_tensor_bytes=1024, group_budget_bytes=None) as handle:
        h = xr
        for layer in layers:
            with handle.group():
                h = h + layer(h)
    loss = h.square().mean()
    (first,) = torch.autograd.grad(loss, xr, retain_graph=True)
    (second,) = torch.autograd.grad(loss, xr)
    assert torch.equal(first, second)
    assert handle.stats["bytes_offloaded"] == handle.stats["bytes_reloaded"] > 0


def test_backward_inside_the_context_and_a_second_step_in_it():
    layers, x = mlp_layers(n=3), torch.randn(40, 32)
    want = run_step(layers, x)
    with offload_activations(min_tensor_bytes=1024, group_budget_bytes=None) as handle:
        for _ in range(2):
            for p in layers.parameters():
                p.grad = None
            xr = x.clone().requires_grad_()
            h = xr
            for layer in layers:
                with handle.group():
                    h = h + layer(h)
            h.float().square().mean().backward()
            got = [h.detach(), xr.grad] + [p.grad for p in layers.parameters()]
            assert all(torch.equal(a, b) for a, b in zip(got, want.tensors))
    stats = handle.stats
    # Per step, three layers and the loss (saved between groups: a group of its own).
    assert stats["groups"] == 8
    assert stats["bytes_offloaded"] == stats["bytes_reloaded"] > 0
    # The loss group is the last of each step: its one saved tensor (square's input) stays.
    assert stats["skipped_kept"] == 2
