import pytest
import torch

import fuseops
from fuseops import ops


def _mlp():
    return fuseops.Sequential(
        ops.RMSNorm(16),
        ops.Linear(16, 32),
        ops.GELU(approximate="tanh"),
        fuseops.Sequential(ops.Linear(32, 16)),
    )


def test_nested_sequentials_are_flattened_and_indexable():
    model = _mlp()
    assert len(model) == 4
    assert [type(op).__name__ for op in model] == ["RMSNorm", "Linear", "GELU", "Linear"]
    assert isinstance(model[3], ops.Linear)
    assert len(model[1:3]) == 2
    model.append(fuseops.Sequential(ops.Identity(), ops.Identity()))
    assert len(model) == 6
    assert "1.weight" in model.state_dict()


def test_plan_records_fusions_with_user_indices():
    model = _mlp()
    x = torch.randn(3, 16, requires_grad=True)
    model(x).sum().backward()
    assert model.plan.forward == [("RMSNorm", (0,)), ("ForwardLinearBiasActivation", (1, 2)), ("Linear", (3,))]
    assert model.plan.backward == [("RMSNorm", (0,)), ("BackwardLinearBiasActivation", (1, 2)), ("Linear", (3,))]


def test_fuse_false_runs_basic_ops_only():
    model = _mlp()
    model.fuse = False
    model(torch.randn(3, 16))
    assert [name for name, _ in model.plan.forward] == ["RMSNorm", "Linear", "GELU", "Linear"]


def test_extra_inputs_are_consumed_in_op_order_and_extra_outputs_returned():
    model = fuseops.Sequential(
        ops.MakeExtraOutput(), ops.Linear(4, 4), ops.AddExtraInput(), ops.SwiGLU(scaled=True), ops.AddExtraInput()
    )
    x, r1, probs, r2 = torch.randn(3, 4), torch.randn(3, 4), torch.rand(3), torch.randn(3, 2)
    y, branch = model(x, r1, probs, r2)
    lin = model[1]
    h = x @ lin.weight.T + lin.bias + r1
    expected = torch.nn.functional.silu(h[:, :2]) * h[:, 2:] * probs[:, None] + r2
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(branch, x)


def test_wrong_number_of_extra_inputs():
    model = fuseops.Sequential(ops.Linear(4, 4), ops.AddExtraInput())
    with pytest.raises(TypeError, match=r"expected 1 extra input\(s\) for AddExtraInput \(1\), got 0"):
        model(torch.randn(2, 4))
    with pytest.raises(TypeError, match="got 2"):
        model(torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4))


def test_non_ops_are_rejected():
    with pytest.raises(TypeError, match="expected fuseops basic ops"):
        fuseops.Sequential(torch.nn.Linear(2, 2))


def _count_saved(fn):
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return count, out


def test_nothing_saved_under_no_grad():
    model = _mlp()
    x = torch.randn(3, 16)
    with torch.no_grad():
        count, y = _count_saved(lambda: model(x))
    assert count == 0 and y.grad_fn is None
    count, y = _count_saved(lambda: model(x))
    assert count > 0 and y.grad_fn is not None


def test_plans_are_cached_per_configuration():
    model = _mlp()
    x = torch.randn(3, 16)
    model(x)
    first = model.plan
    model(torch.randn(7, 16))
    assert model.plan is first
    model(x.requires_grad_())
    assert model.plan is not first


def test_frozen_parameters_get_no_grad():
    model = _mlp()
    model[1].weight.requires_grad_(False)
    model(torch.randn(3, 16)).sum().backward()
    assert model[1].weight.grad is None and model[1].bias.grad is not None
    assert model[0].weight.grad is not None


def test_single_op_called_directly():
    lin = ops.Linear(4, 2)
    x = torch.randn(3, 4, requires_grad=True)
    lin(x).sum().backward()
    torch.testing.assert_close(x.grad, lin.weight.sum(0).expand(3, 4))


def test_tied_parameters_accumulate():
    a, b = ops.Linear(4, 4, bias=False), ops.Linear(4, 4, bias=False)
    b.weight = a.weight
    model = fuseops.Sequential(a, b)
    x = torch.randn(2, 4)
    model(x).sum().backward()
    w = a.weight.detach().clone().requires_grad_()
    ((x @ w.T) @ w.T).sum().backward()
    torch.testing.assert_close(a.weight.grad, w.grad)


def test_backward_stops_where_nothing_needs_a_gradient():
    frozen = ops.Linear(4, 4)
    frozen.requires_grad_(False)
    model = fuseops.Sequential(frozen, ops.ReLU(), ops.Linear(4, 2))
    model(torch.randn(3, 4)).sum().backward()
    assert model[2].weight.grad is not None and frozen.weight.grad is None
