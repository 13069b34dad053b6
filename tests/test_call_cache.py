"""A call whose signature was seen before skips the checks, the planning and the context
building (``fuseops/call_cache.py``): whatever changed between two calls must still be seen,
and bad input must still raise before anything runs."""

from __future__ import annotations

import copy

import pytest
import torch

import fuseops
from fuseops import ops


def _dense() -> fuseops.Sequential:
    torch.manual_seed(0)
    return fuseops.Sequential(ops.RMSNorm(8), ops.Linear(8, 16), ops.GELU(approximate="tanh"), ops.Linear(16, 8),
                              ops.AddExtraInput())


def _grouped() -> fuseops.Sequential:
    torch.manual_seed(0)
    return fuseops.Sequential(ops.GroupedLinear(3, 8, 32), ops.SwiGLU(), ops.GroupedLinear(3, 16, 8))


def _grads(model: torch.nn.Module, x: torch.Tensor, *extras) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    y = model(x, *extras)
    y.backward(torch.cos(torch.arange(y.numel(), dtype=y.dtype)).view_as(y))
    return y.detach(), [x.grad] + [p.grad for p in model.parameters()]


def _same(a, b) -> None:
    ya, ga = a
    yb, gb = b
    torch.testing.assert_close(ya, yb)
    assert len(ga) == len(gb)
    for u, v in zip(ga, gb):
        assert (u is None) == (v is None)
        if u is not None:
            torch.testing.assert_close(u, v)


def test_repeated_calls_match_a_fresh_model() -> None:
    model, fresh = _dense(), _dense()
    x = torch.randn(5, 8)
    first = _grads(model, x, x)
    for _ in range(3):
        _same(_grads(model, x, x), first)
    _same(_grads(fresh, x, x), first)


def test_bad_input_still_raises_after_a_cached_call() -> None:
    model = _dense()
    x = torch.randn(5, 8)
    model(x, x)
    with pytest.raises(ValueError, match="expected shape"):
        model(torch.randn(5, 7), torch.randn(5, 7))
    with pytest.raises(TypeError, match="dtype"):
        model(x.double().float().half(), x.half())
    with pytest.raises(ValueError, match="extra input r"):
        model(x, torch.randn(4, 8))
    with pytest.raises(TypeError, match="extra input"):
        model(x)


def test_split_size_lists_are_read_each_call() -> None:
    model = _grouped()
    x = torch.randn(6, 8)
    sizes = [2, 4, 0]
    y1 = model(x, sizes, sizes)
    # The same list object, changed in place: a cached call must not keep the old values.
    sizes[:] = [0, 2, 4]
    y2 = model(x, sizes, sizes)
    torch.testing.assert_close(y2, _grouped()(x, [0, 2, 4], [0, 2, 4]))
    assert not torch.allclose(y1, y2)
    sizes[:] = [0, 2, 5]
    with pytest.raises(ValueError, match="summing to the 6 input rows"):
        model(x, sizes, sizes)
    # Equal as Python values, refused by the checks: True == 1 and hash(True) == hash(1).
    model(x, [1, 2, 3], [1, 2, 3])
    with pytest.raises(TypeError, match="expected ints"):
        model(x, [True, 2, 3], [True, 2, 3])


def test_cpu_split_size_tensors_are_read_each_call() -> None:
    model = _grouped()
    x = torch.randn(6, 8)
    sizes = torch.tensor([2, 4, 0])
    model(x, sizes, sizes)
    sizes.copy_(torch.tensor([3, 4, 0]))
    with pytest.raises(ValueError, match="summing to the 6 input rows"):
        model(x, sizes, sizes)


def test_requires_grad_changes_are_seen() -> None:
    model, reference = _dense(), _dense()
    x = torch.randn(5, 8)
    _grads(model, x, x)
    assert ("BackwardLinearBiasActivation", (1, 2)) in model.plan.backward
    # A frozen bias: that fusion's guard declines (it reduces the bias gradient).
    model[1].bias.requires_grad_(False)
    reference[1].bias.requires_grad_(False)
    _same(_grads(model, x, x), _grads(reference, x, x))
    assert ("BackwardLinearBiasActivation", (1, 2)) not in model.plan.backward
    assert model[1].bias.grad is None


def test_training_and_fuse_changes_are_seen() -> None:
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(8, 8), ops.Dropout(0.5))
    x = torch.randn(5, 8)
    model(x)
    model.eval()
    torch.testing.assert_close(model(x), torch.nn.functional.linear(x, model[0].weight, model[0].bias))
    dense = _dense()
    y = dense(x, x)
    assert ("ForwardLinearBiasActivation", (1, 2)) in dense.plan.forward
    dense.fuse = False
    torch.testing.assert_close(dense(x, x), y)
    assert [name for name, _ in dense.plan.forward] == ["RMSNorm", "Linear", "GELU", "Linear", "AddExtraInput"]


def test_replaced_and_converted_parameters_are_seen() -> None:
    model = _dense()
    x = torch.randn(5, 8)
    model(x, x)
    new = torch.nn.Parameter(torch.randn(16, 8))
    model[1].weight = new
    reference = copy.deepcopy(model)
    _same(_grads(model, x, x), _grads(reference, x, x))
    assert new.grad is not None
    model.double()
    xd = x.double()
    y = model(xd, xd)
    assert y.dtype == torch.float64
    with pytest.raises(TypeError, match="dtype"):
        model(x, x)


def test_hooks_added_after_cached_calls_fire() -> None:
    model = _dense()
    x = torch.randn(5, 8)
    model(x, x)
    seen = []
    model[2].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    model(x, x)
    assert seen == [torch.Size([5, 16])]


def test_tied_and_aliased_inputs_get_one_gradient_each() -> None:
    model = _dense()
    x = torch.randn(5, 8, requires_grad=True)
    r = torch.randn(5, 8, requires_grad=True)
    # x as its own residual, then a separate residual, then x again: three signatures.
    for residual in (x, r, x):
        model.zero_grad(set_to_none=True)
        x.grad = r.grad = None
        model(x, residual).sum().backward()
        assert x.grad is not None
        assert (r.grad is not None) == (residual is r)


def test_a_parameter_resized_in_place_is_checked_again() -> None:
    """``param.data = t`` keeps the parameter's id and may change its shape: the checks see
    it, as on a first call."""
    model = _dense()
    x = torch.randn(5, 8)
    model(x, x)
    model[1].weight.data = torch.randn(16, 4)
    with pytest.raises(ValueError, match=r"Linear.weight: shape \(16, 4\)"):
        model(x, x)


def test_a_grouped_weight_resized_in_place_is_checked_again() -> None:
    model = _grouped()
    x, sizes = torch.randn(6, 8), [2, 1, 3]
    model(x, sizes, sizes)
    model[2].weight.data = torch.randn(3, 8, 8)
    with pytest.raises(ValueError, match=r"GroupedLinear.weight: shape \(3, 8, 8\)"):
        model(x, sizes, sizes)


def test_torch_autocast_and_recipes_are_seen() -> None:
    """The same shapes in and out of ``torch.autocast`` and a ``fuseops.autocast`` recipe:
    each call computes what a fresh model computes under the same context."""
    model = _dense()
    x = torch.randn(5, 8)

    def fresh(ctx):
        with ctx():
            return _grads(copy.deepcopy(model), x, x)

    def cached(ctx):
        with ctx():
            return _grads(model, x, x)

    contexts = [
        lambda: torch.autocast("cpu", dtype=torch.bfloat16),
        lambda: fuseops.autocast(fuseops.recipes.FP8CurrentScaling()),
        torch.enable_grad,
    ]
    for ctx in contexts + contexts[::-1]:
        y, grads = cached(ctx)
        y_ref, grads_ref = fresh(ctx)
        assert y.dtype == y_ref.dtype
        _same((y, grads), (y_ref, grads_ref))


def _changed(name: str, model: fuseops.Sequential) -> fuseops.Sequential:
    """``model`` with one setting (or op) changed after it ran, the way a user would change it."""
    if name == "eps":
        model[0].eps = 0.5
    elif name == "approximate":
        model[2].approximate = "none"
    elif name == "op replaced":
        setattr(model, "2", ops.ReLU())
    return model


@pytest.mark.parametrize("change", ["eps", "approximate", "op replaced"])
def test_a_setting_or_op_changed_after_repeated_calls_is_seen(change) -> None:
    """Plans and prepared runs hold the ops' settings as constants: a
    change drops them (``op.settings_epoch``, ``Sequential.__setattr__``), as torch.nn reads
    ``eps`` at every call; the result is a fresh model's with the same setting, and the torch
    reference's."""
    model = _dense()
    x = torch.randn(5, 8)
    for _ in range(4):
        _grads(model, x, x)
    got = _grads(_changed(change, model), x, x)
    fresh = _changed(change, _dense())
    _same(got, _grads(fresh, x, x))
    norm, fc1, act, fc2, _ = fresh
    with torch.no_grad():
        h = torch.nn.functional.rms_norm(x.double(), (8,), norm.weight.double(), norm.eps)
        h = fc1.weight.double() @ h.T
        h = (h.T + fc1.bias.double())
        h = torch.relu(h) if change == "op replaced" else torch.nn.functional.gelu(h, approximate=act.approximate)
        want = h @ fc2.weight.double().T + fc2.bias.double() + x.double()
    torch.testing.assert_close(got[0], want.float())


def _kept_runs(model: fuseops.Sequential) -> list:
    """The prepared runs ``model`` keeps, by call signature (``fuseops/call_cache.py``)."""
    return list(model._calls.runs.values())


def test_setting_a_setting_to_its_value_keeps_what_was_planned() -> None:
    model = _dense()
    x = torch.randn(5, 8)
    for _ in range(3):
        _grads(model, x, x)
    before = _kept_runs(model)
    model[0].eps = float(model[0].eps)
    model[2].approximate = "tanh"
    _grads(model, x, x)
    after = _kept_runs(model)
    assert len(before) == 1 and len(after) == 1 and after[0] is before[0]


def test_only_basic_ops_can_be_put_in() -> None:
    model = _dense()
    with pytest.raises(TypeError, match="expected fuseops basic ops"):
        setattr(model, "1", torch.nn.Linear(8, 16))
    with pytest.raises(TypeError, match="expected fuseops basic ops"):
        model.register_module("5", torch.nn.ReLU())


def test_a_gated_activations_scaled_flag_changed_after_calls_is_seen() -> None:
    """``scaled`` decides whether the op takes the router's probs (``num_extra_inputs``): set
    after repeated calls, the next call takes them, and unset again, it does not; each result
    equals the float64 reference. A value that is not a flag raises, naming it."""
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(8, 32), ops.SwiGLU(), ops.Linear(16, 8))
    x, probs = torch.randn(5, 8), torch.rand(5)

    def reference(scale: torch.Tensor | None) -> torch.Tensor:
        fc1, _, fc2 = model
        with torch.no_grad():
            z = x.double() @ fc1.weight.double().T + fc1.bias.double()
            a, b = z.chunk(2, -1)
            h = torch.nn.functional.silu(a) * b
            h = h if scale is None else h * scale.double()[:, None]
            return h @ fc2.weight.double().T + fc2.bias.double()

    for _ in range(3):
        torch.testing.assert_close(model(x), reference(None).float())
    model[1].scaled = True
    for _ in range(3):
        torch.testing.assert_close(model(x, probs), reference(probs).float())
    with pytest.raises(TypeError, match=r"expected 1 extra input\(s\) for SwiGLU"):
        model(x)
    model[1].scaled = False
    torch.testing.assert_close(model(x), reference(None).float())
    with pytest.raises(TypeError, match="scaled: expected True or False, got 'yes'"):
        model[1].scaled = "yes"


def test_a_public_object_attribute_replaced_after_calls_is_seen() -> None:
    """An op's public attribute holding an object (``Linear.tensor_parallel``, a collective's
    ``group``) replaced by another after calls drops the Sequential's plans as a setting does:
    the next call plans afresh. The same object set again, or an object under a private name
    (an op's own state), keeps them."""
    from fuseops.ops import op as op_module

    model = _dense()
    x = torch.randn(5, 8)
    for _ in range(3):
        _grads(model, x, x)
    config = object()
    model[2].config = config
    epoch = op_module.settings_epoch
    _grads(model, x, x)
    before = _kept_runs(model)
    model[2].config = config
    model[2]._state = object()
    model[2]._state = object()
    assert op_module.settings_epoch == epoch
    _grads(model, x, x)
    assert _kept_runs(model)[0] is before[0]
    model[2].config = object()
    assert op_module.settings_epoch == epoch + 1
    _grads(model, x, x)
    assert _kept_runs(model)[0] is not before[0]  # planned afresh


def _kept(model: fuseops.Sequential) -> set[int]:
    """The distinct prepared runs a model keeps, by identity."""
    return {id(p) for p in (*model._calls.runs.values(), *model._calls.general.values())}


@pytest.mark.parametrize("form", ["list", "cpu tensor"])
def test_changing_row_counts_and_split_sizes_reuse_one_prepared_run(form) -> None:
    # Expert parallelism: every step receives another row count, in other groups. The checks
    # read those (and run each call); the plan, contexts and layout do not.
    model = _grouped()
    seen = []
    for sizes in ([2, 4, 0], [1, 1, 5], [0, 3, 6]):
        rows = sum(sizes)
        split = sizes if form == "list" else torch.tensor(sizes)
        x = torch.randn(rows, 8)
        got = _grads(model, x, split, split)
        fresh = _grouped()
        _same(got, _grads(fresh, x, split, split))
        assert (model.plan.forward, model.plan.backward) == (fresh.plan.forward, fresh.plan.backward)
        seen.append(model.plan)
    assert len(_kept(model)) == 1
    assert seen[0] is seen[1] is seen[2]
    # A sum that does not match the rows still raises eager's error, for a new row count too.
    bad = [2, 2, 2] if form == "list" else torch.tensor([2, 2, 2])
    with pytest.raises(ValueError, match="summing to the 7 input rows"):
        model(torch.randn(7, 8), bad, bad)
    with pytest.raises(ValueError, match="summing to the 9 input rows"):
        model(torch.randn(9, 8), bad, bad)


def test_changing_row_counts_of_a_dense_block_reuse_one_prepared_run() -> None:
    model = _dense()
    for rows in (3, 5, 9):
        x = torch.randn(rows, 8)
        _same(_grads(model, x, x), _grads(_dense(), x, x))
        with torch.no_grad():
            torch.testing.assert_close(model(x, x), _dense()(x, x))
    # One run for calls with grad and one without.
    assert len(_kept(model)) == 2
    # An extra input whose rows do not match the input's: eager's error.
    with pytest.raises(ValueError, match="extra input r"):
        model(torch.randn(6, 8), torch.randn(4, 8))


def test_a_run_kept_for_equal_split_sizes_is_not_taken_for_different_ones():
    # The fused MLP needs both GroupedLinears to get the same sizes: a call whose two lists
    # differ in value (same count, same rows) must plan again, not take the fused run.
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.GroupedLinear(2, 4, 8), ops.SwiGLU(), ops.GroupedLinear(2, 4, 4))
    reference = fuseops.Sequential(*model, fuse=False)
    x = torch.randn(3, 4)
    for first, second in (([1, 2], [1, 2]), ([2, 1], [1, 2]), ([1, 2], [2, 1]), ([2, 1], [2, 1])):
        torch.testing.assert_close(model(x, first, second), reference(x, first, second))
        fused = first == second
        assert (model.plan.forward == [("GroupedMLP", (0, 1, 2))]) == fused, (first, second, model.plan.forward)
