"""mark_not_offload: tensors, views of them, and quantized/grouped storages buffer by buffer."""

from dataclasses import dataclass

import pytest
import torch

import fuseops
from fuseops.offload import mark_not_offload, offload_activations
from fuseops.ops import BasicOp, OpGrads, Saved
from fuseops.ops.contract import activation
from tests.offload._models import offloaded_like_plain


class KeepStorage(torch.autograd.Function):
    """Saves ``saved`` and returns, in backward, its data pointers and values as seen."""

    seen = []

    @staticmethod
    def forward(ctx, x, *saved):
        ctx.save_for_backward(*saved)
        return x * 2

    @staticmethod
    def backward(ctx, dy):
        KeepStorage.seen = [(t.data_ptr(), t.clone()) for t in ctx.saved_tensors]
        return (dy * 2,) + (None,) * len(ctx.saved_tensors)


def save_and_backward(saved, *, mark=(), mark_late=()):
    x = torch.randn(8, requires_grad=True)
    with offload_activations(min_tensor_bytes=0, keep_last=1, group_budget_bytes=None) as handle:
        mark_not_offload(*mark)
        with handle.group():
            y = KeepStorage.apply(x, *saved)
        mark_not_offload(*mark_late)
        with handle.group():
            y = y * y
    y.sum().backward()
    return handle.stats, KeepStorage.seen


def test_marked_tensor_and_its_views_stay_on_device():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    stats, seen = save_and_backward([a, a[3:].t(), b], mark=[a])
    assert stats["skipped_marked"] == 2 and stats["tensors_offloaded"] == 1
    assert seen[0][0] == a.data_ptr() and seen[1][0] == a[3:].data_ptr()
    assert seen[2][0] != b.data_ptr() and torch.equal(seen[2][1], b)


def test_mark_after_the_save_counts_until_the_group_moves():
    a = torch.randn(64, 64)
    stats, seen = save_and_backward([a], mark_late=[a])
    assert stats["skipped_marked"] == 1 and stats["bytes_offloaded"] == 0
    assert seen[0][0] == a.data_ptr()


@dataclass(frozen=True)
class FakeQuantized:
    """A quantized storage as fuseops' fuser sees one: plain buffers behind data_tensors()."""

    data: torch.Tensor
    scale: torch.Tensor

    def data_tensors(self):
        return [self.data, self.scale]

    def with_data_tensors(self, tensors):
        return FakeQuantized(*tensors)

    def dequantize(self):
        return self.data.float() * self.scale.repeat_interleave(self.data.shape[-1] // self.scale.shape[-1], -1)


@dataclass(frozen=True)
class ScaleSaved(Saved):
    q: FakeQuantized | None = activation()


class QuantizedScale(BasicOp):
    """``y = x * dequantize(q)``, saving the quantized storage as an activation."""

    def __init__(self, mark: bool):
        super().__init__()
        self.mark = mark

    def op_forward(self, ctx, x, extra_inputs):
        q = FakeQuantized((x.abs() * 8).to(torch.uint8), x.abs().amax(-1, keepdim=True) + 1)
        if self.mark:
            mark_not_offload(q)
        if ctx.needs_backward:
            ctx.saved = ScaleSaved(q=q)
        return x * q.dequantize(), ()

    def op_backward(self, ctx, dy, extra_output_grads):
        return OpGrads(dy * ctx.saved.q.dequantize())


@pytest.mark.parametrize("mark", [False, True])
def test_quantized_storage_moves_or_stays_buffer_by_buffer(mark):
    model = fuseops.Sequential(QuantizedScale(mark), fuseops.ops.Identity())
    x = torch.randn(256, 64)

    stats = offloaded_like_plain(model, x).stats
    moved = 256 * 64 + 256 * 4  # uint8 data, float32 scales
    if mark:
        assert stats["skipped_marked"] == 2 and stats["bytes_offloaded"] == 0
    else:
        assert stats["tensors_offloaded"] == 2 and stats["bytes_offloaded"] == stats["bytes_reloaded"] == moved


def test_mark_rejects_other_objects_and_ignores_none():
    mark_not_offload(None)
    expected = r"tensors\[1\]: expected a torch.Tensor or a storage with data_tensors\(\), got int"
    with pytest.raises(TypeError, match=expected):
        mark_not_offload(torch.zeros(1), 3)
