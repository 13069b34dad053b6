"""The executor's save notice (``ops/executor/save_notice.py``): after each step of a plan's
forward, and inside the fused expert MLP as each saved tensor is made, a registered
receiver hears of exactly the activations the Function then saves; nothing without a
backward, under torch.func, or with no receiver."""

import pytest
import torch
from torch import nn

import fuseops
from fuseops import ops
from fuseops.ops.executor import save_notice


@pytest.fixture
def heard(monkeypatch):
    """The lists of tensors the receiver is handed, in order."""
    calls = []
    monkeypatch.setattr(save_notice, "_receiver", calls.append)
    return calls


def _saved(fn):
    """``fn()``'s result and the tensors autograd saved meanwhile, parameters left out (the
    executor saves those too, for their version check; they are never noticed)."""
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, [t for t in packed if not isinstance(t, nn.Parameter)]


def _same(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def test_each_step_notices_exactly_what_the_function_saves(heard):
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(16, 32), ops.GELU(), ops.Linear(32, 16))
    x = torch.randn(8, 16, requires_grad=True)
    y, saved = _saved(lambda: model(x))
    # One notice per step of the plan's forward (each step here saves something).
    assert len(heard) == len(model.plan.forward) >= 2
    assert saved and _same([t for step in heard for t in step], saved)
    y.sum().backward()


def test_the_fused_expert_mlp_notices_its_input_before_its_gemms_and_z_between_them(heard):
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.GroupedLinear(3, 16, 24), ops.SwiGLU(), ops.GroupedLinear(3, 12, 16))
    x = torch.randn(10, 16, requires_grad=True)
    sizes = torch.tensor([3, 0, 7])
    y, saved = _saved(lambda: model(x, sizes, sizes))
    # One fused step: x (FC1's record) as it starts, z (SwiGLU's) once FC1's GEMM made
    # it, then the step's end notices both again (the scheduler finds their records).
    assert len(saved) == 2 and saved[0] is x
    assert [len(step) for step in heard] == [1, 1, 2]
    assert heard[0][0] is saved[0] and heard[1][0] is saved[1] and _same(heard[2], saved)
    y.sum().backward()


def test_nothing_is_noticed_without_a_backward_or_under_torch_func(heard):
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(16, 32), ops.GELU(), ops.Linear(32, 16))
    x = torch.randn(8, 16, requires_grad=True)
    with torch.no_grad():
        model(x)
    for p in model.parameters():
        p.requires_grad_(False)
    model(x.detach())  # no input or parameter needs grad: no Function runs
    for p in model.parameters():
        p.requires_grad_(True)
    torch.func.grad(lambda x: model(x).sum())(x.detach())
    assert heard == []
    model(x)
    assert heard


def test_an_early_notice_outside_a_noticing_forward_reaches_nobody(heard):
    # The fused op's own notices go only where the executor opened them (its forward on
    # this thread, noticing): not from a forward that will not save through the hooks.
    ctx_like = type("Ctx", (), {"saved": None})()
    save_notice.notice_early([ctx_like])
    assert heard == []
