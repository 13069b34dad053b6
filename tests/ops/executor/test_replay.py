"""Recorded plan runs (``fuseops/ops/executor/replay.py``): a ``Sequential`` records the second
call of an input layout and replays the later ones, with the results of the full path, bit for
bit; where replaying could differ, the recording is refused and the full path runs. The fusion
property suite checks a replayed call of every registered fusion; these tests pin the rules."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import weakref

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.ops.executor import replay
from tests.helpers import assert_bitwise, float32_matmul_precision, kernels_on

H = 16


def _dense(norm=ops.RMSNorm, gated=False):
    """A pre-norm MLP block with its residual add."""
    act, inner = (ops.SwiGLU(), 2 * H) if gated else (ops.GELU(approximate="tanh"), 4 * H)
    return fuseops.Sequential(norm(H), ops.Linear(H, 4 * H), act, ops.Linear(inner, H), ops.AddExtraInput())


MODELS = {
    "dense_gelu": lambda: _dense(),
    "dense_swiglu_layernorm": lambda: _dense(norm=ops.LayerNorm, gated=True),
    "residual_branch": lambda: fuseops.Sequential(ops.MakeExtraOutput(), ops.RMSNorm(H), ops.Linear(H, H)),
    "grouped": lambda: fuseops.Sequential(ops.GroupedLinear(4, H, 2 * H), ops.SwiGLU(), ops.GroupedLinear(4, H, H)),
}


def _inputs(name, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, H, generator=g).to(device)
    if name.startswith("dense"):
        return [x, torch.randn(8, H, generator=g).to(device)]
    if name == "grouped":
        sizes = torch.tensor([2, 4, 0, 2], device=device)
        return [x, sizes, sizes]
    return [x]


def _step(model, inputs):
    for p in model.parameters():
        p.grad = None
    inputs = [t.detach().clone().requires_grad_() if t.is_floating_point() else t for t in inputs]
    out = model(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    sum(((o.double() * (i + 1)) ** 2).sum() for i, o in enumerate(outs)).backward()
    return [o.detach() for o in outs] + [t.grad for t in inputs if t.is_floating_point()] + [
        p.grad for p in model.parameters()]


def _full_then_replayed(model, calls, monkeypatch):
    """Each call's results on the full path, then with replay on (the second call of the
    layout records, the later ones replay); the counts' change over the latter."""
    monkeypatch.setattr(replay, "ENABLED", False)
    full = [_step(model, inputs) for inputs in calls]
    monkeypatch.setattr(replay, "ENABLED", True)
    before = dict(replay.counts)
    replayed = [_step(model, inputs) for inputs in calls]
    for i, (a, b) in enumerate(zip(full, replayed)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert_bitwise(y, x, f"call {i} output/grad {j}")
    return {k: replay.counts[k] - before[k] for k in before}


@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("name", MODELS)
def test_replay_equals_the_full_path(name, kernels, monkeypatch):
    with kernels_on(kernels) as device:
        torch.manual_seed(0)
        model = MODELS[name]().to(device)
        delta = _full_then_replayed(model, [_inputs(name, device, s) for s in range(4)], monkeypatch)
    if name == "grouped" and kernels == "reference":
        # The grouped references read split offsets they computed on the host: never replayed.
        assert delta["replayed"] == 0 and delta["refused"] > 0
    else:
        # The second call records forward and backward, the third and fourth replay both.
        assert delta == {"recorded": 2, "replayed": 4, "refused": 0}


def test_a_new_input_layout_records_its_own_program(monkeypatch):
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, H))
    contiguous = [[torch.randn(8, H)] for _ in range(3)]
    # Same shape, dtype and signature; other strides.
    transposed = [[torch.randn(H, 8).t()] for _ in range(3)]
    delta = _full_then_replayed(model, contiguous + transposed, monkeypatch)
    assert delta == {"recorded": 4, "replayed": 4, "refused": 0}


def test_a_change_of_the_float32_matmul_precision_records_its_own_program(monkeypatch):
    # A program keeps its launches' F32_DOT: replayed after the setting changed, its float32
    # GEMMs would multiply in the old precision (tests/kernels/gemm/test_float32_precision.py).
    with kernels_on("triton") as device:
        torch.manual_seed(0)
        model = MODELS["grouped"]().to(device)
        calls = [_inputs("grouped", device, s) for s in range(3)]
        deltas = []
        for precision in ("ieee", "tf32"):
            with float32_matmul_precision(precision):
                deltas.append(_full_then_replayed(model, calls, monkeypatch))
    assert deltas == [{"recorded": 2, "replayed": 2, "refused": 0}] * 2


class _HostRead(ops.Identity):
    """Reads a value of its input on the host (and ignores it)."""

    def op_forward(self, ctx, x, extra_inputs):
        bool((x > 0).any())
        return super().op_forward(ctx, x, extra_inputs)


class _DataDependentShape(ops.Identity):
    """Runs an op whose output shape depends on the data (and ignores it)."""

    def op_forward(self, ctx, x, extra_inputs):
        torch.nonzero(x)
        return super().op_forward(ctx, x, extra_inputs)


@pytest.mark.parametrize("op, reason", [(_HostRead, "host read"), (_DataDependentShape, "data-dependent")])
def test_what_replaying_could_get_wrong_keeps_the_full_path(op, reason, monkeypatch):
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(H, H), op(), ops.Linear(H, H))
    replay.refusals.clear()
    delta = _full_then_replayed(model, [[torch.randn(8, H)] for _ in range(4)], monkeypatch)
    # The forward is refused; the backward, which reads nothing on the host, replays.
    assert delta == {"recorded": 1, "replayed": 2, "refused": 1}
    assert any(reason in why for why in replay.refusals), replay.refusals
    # The refusal closes the forward for every layout: later calls compute no layout key.
    (prepared,) = model._calls._runs.values()
    assert prepared.layouts.forward is None and prepared.layouts.backward


def test_a_tensor_made_before_the_call_keeps_the_full_path(monkeypatch):
    cached = torch.randn(H)

    class _Cached(ops.Identity):
        def op_forward(self, ctx, x, extra_inputs):
            y, outs = super().op_forward(ctx, x, extra_inputs)
            return y + cached, outs

    model = fuseops.Sequential(ops.Linear(H, H), _Cached())
    replay.refusals.clear()
    delta = _full_then_replayed(model, [[torch.randn(8, H)] for _ in range(4)], monkeypatch)
    assert delta["refused"] == 1
    assert any("outside the call" in why for why in replay.refusals), replay.refusals


def _autocast_dtype(device):
    return torch.bfloat16 if device.type == "cpu" else torch.float16


@pytest.mark.parametrize("weights", ["float32", "low"])
@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("name", ["dense_gelu", "dense_swiglu_layernorm", "grouped"])
def test_autocast_replays_the_full_path(name, kernels, weights, monkeypatch):
    """Under ``torch.autocast`` (mixed precision the torch way) with float32 weights, the
    program asks the weight cache for their casts at every call; with weights and inputs
    already in the autocast dtype there is nothing to cast. Either way it runs with autocast
    off, as the ops did when it was recorded (else torch would re-cast its aten ops: session
    22's replay did, and differed from the full path by up to 0.06 in bf16)."""
    with kernels_on(kernels) as device:
        torch.manual_seed(0)
        dtype = torch.float32 if weights == "float32" else _autocast_dtype(device)
        model = MODELS[name]().to(device, dtype)
        calls = [[t.to(dtype) if t.is_floating_point() else t for t in _inputs(name, device, s)] for s in range(4)]
        with torch.autocast(device.type, dtype=_autocast_dtype(device)):
            delta = _full_then_replayed(model, calls, monkeypatch)
    if name == "grouped" and kernels == "reference":
        assert delta["replayed"] == 0 and delta["refused"] > 0  # host-read split offsets, as without autocast
    else:
        assert delta == {"recorded": 2, "replayed": 4, "refused": 0}


@pytest.mark.parametrize("change", ["optimizer_step", "data_replaced", "load_state_dict", "no_grad_forward"])
def test_a_replay_under_autocast_never_uses_a_stale_cast(change, monkeypatch):
    """Between replays the float32 weights change: every replayed call equals the full path's
    with the same weights, bit for bit (the cast is remade, never reused stale)."""
    def run(enabled):
        monkeypatch.setattr(replay, "ENABLED", enabled)
        torch.manual_seed(0)
        model = _dense()
        sgd = torch.optim.SGD(model.parameters(), lr=0.1)
        results = []
        for s in range(5):
            inputs = _inputs("dense_gelu", "cpu", s)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                if change == "no_grad_forward":
                    with torch.no_grad():
                        results.append([model(*inputs)])
                else:
                    results.append(_step(model, inputs))
            with torch.no_grad():
                if change in ("optimizer_step", "no_grad_forward"):
                    for p in model.parameters():
                        p.grad = torch.full_like(p, 0.5 + s)
                    sgd.step()
                elif change == "data_replaced":
                    for p in model.parameters():
                        p.data = p.data * 1.5
                else:
                    model.load_state_dict({k: v * 0.75 for k, v in model.state_dict().items()})
        return results

    full = run(False)
    before = dict(replay.counts)
    replayed = run(True)
    assert replay.counts["replayed"] - before["replayed"] >= 2
    for i, (a, b) in enumerate(zip(full, replayed)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert_bitwise(y, x, f"call {i} output/grad {j}")


def test_the_recording_frees_what_the_call_frees():
    freed = []

    def body(x):
        scratch = x * 2
        seen = weakref.ref(scratch)
        out = scratch + 1
        del scratch
        freed.append(seen() is None)
        return out

    x = torch.randn(4)
    out, program = replay.record([x], lambda _: body(x), lambda out: [out])
    assert freed == [True]
    assert isinstance(program, replay.Program)
    (again,) = program.run(x)
    assert_bitwise(again, out)


def test_a_saved_input_changed_in_place_before_a_replayed_backward_raises(monkeypatch):
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, H))
    for _ in range(3):
        _step(model, [torch.randn(8, H)])
    before = replay.counts["replayed"]
    x = torch.randn(8, H, requires_grad=True)
    y = model(x * 1)
    assert replay.counts["replayed"] == before + 1
    weight = model[1].weight
    with torch.no_grad():
        weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_a_hook_added_after_replays_runs():
    torch.manual_seed(0)
    model = _dense()
    for s in range(3):
        _step(model, _inputs("dense_gelu", "cpu", s))
    seen = []
    model[2].register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    _step(model, _inputs("dense_gelu", "cpu", 3))
    assert seen == [torch.Size([8, 4 * H])]


@pytest.mark.parametrize("backward", ["retain_graph", "create_graph"])
def test_a_replayed_forward_serves_a_backward_on_the_full_path(backward, monkeypatch):
    """A replayed forward leaves its records unfilled (``saved_state.Unfilled``); a backward that
    takes the full path fills them: a new backward layout (the graph kept) or create_graph."""
    torch.manual_seed(0)
    model = _dense()
    reference = copy.deepcopy(model)

    def step(m, inputs):
        for p in m.parameters():
            p.grad = None
        inputs = [t.detach().clone().requires_grad_() for t in inputs]
        (m(*inputs).double() ** 2).sum().backward(**{backward: True})
        return [t.grad.detach() for t in inputs] + [p.grad.detach() for p in m.parameters()]

    monkeypatch.setattr(replay, "ENABLED", False)
    want = step(reference, _inputs("dense_gelu", "cpu", 3))
    monkeypatch.setattr(replay, "ENABLED", True)
    for s in range(3):
        _step(model, _inputs("dense_gelu", "cpu", s))
    before = dict(replay.counts)
    got = step(model, _inputs("dense_gelu", "cpu", 3))
    # The forward replayed; the backward ran the full path.
    assert {k: replay.counts[k] - before[k] for k in before} == {"recorded": 0, "replayed": 1, "refused": 0}
    for i, (a, b) in enumerate(zip(got, want)):
        assert_bitwise(a, b, f"grad {i}")


def test_a_tensor_left_by_a_finished_torch_func_transform_is_taken_as_its_value():
    """A dead functorch wrapper (a tensor kept from inside ``torch.func.grad``) passed in is
    unwrapped, as ``Function.apply`` unwraps it (the executor enters the Function under it)."""
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(H, H), ops.GELU())
    kept = []

    def f(x):
        y = x * 2
        kept.append(y)
        return y.sum()

    x = torch.randn(8, H)
    torch.func.grad(f)(x)
    assert torch._C._functorch.is_functorch_wrapped_tensor(kept[0])
    for _ in range(4):
        out = model(kept[0])
        assert_bitwise(out, model(x * 2))


def test_fuseops_debug_set_through_os_environ_turns_replay_off_at_once(monkeypatch):
    monkeypatch.delenv("FUSEOPS_DEBUG", raising=False)
    assert replay.enabled_now() == replay.ENABLED
    monkeypatch.setenv("FUSEOPS_DEBUG", "1")
    assert not replay.enabled_now()
    monkeypatch.setenv("FUSEOPS_DEBUG", "0")
    assert replay.enabled_now() == replay.ENABLED


def test_replay_off(monkeypatch):
    monkeypatch.setattr(replay, "ENABLED", False)
    model = _dense()
    before = dict(replay.counts)
    for s in range(4):
        _step(model, _inputs("dense_gelu", "cpu", s))
    assert replay.counts == before


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_inference_without_grad_replays(kernels, monkeypatch):
    with kernels_on(kernels) as device:
        torch.manual_seed(0)
        model = MODELS["residual_branch"]().to(device)
        calls = [_inputs("residual_branch", device, s) for s in range(4)]
        with torch.no_grad():
            monkeypatch.setattr(replay, "ENABLED", False)
            full = [model(*inputs) for inputs in calls]
            monkeypatch.setattr(replay, "ENABLED", True)
            before = dict(replay.counts)
            replayed = [model(*inputs) for inputs in calls]
    assert {k: replay.counts[k] - before[k] for k in before} == {"recorded": 1, "replayed": 2, "refused": 0}
    for a, b in zip(full, replayed):
        for x, y in zip(a, b):
            assert_bitwise(y, x)


def test_vmap_without_grad_is_never_recorded():
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(H, H))
    batch = torch.randn(3, 8, H)
    before = dict(replay.counts)
    with torch.no_grad():
        for _ in range(3):
            out = torch.func.vmap(model)(batch)
        for _ in range(3):
            single = model(batch[0])
    assert replay.counts["recorded"] - before["recorded"] == 1  # the unbatched calls' only
    assert_bitwise(single, out[0])


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("kernels", ["reference", "triton"])
@pytest.mark.parametrize("name", ["dense_gelu", "grouped"])
def test_a_save_receiver_hears_of_the_same_tensors_in_a_replay(name, kernels, autocast, monkeypatch):
    """Offload's early notice (``save_notice.py``): a replayed forward hands the receiver the
    tensors it then saves, at the same points and in the same order as the full path (also
    under autocast with float32 weights, whose casts the program asks the weight cache for)."""
    from fuseops.ops.executor.save_notice import set_receiver

    def noticed_and_saved(model, inputs):
        heard, saved = [], []
        previous = set_receiver(lambda tensors: heard.append([id(t) for t in tensors]))
        try:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(id(t)) or t, lambda t: t):
                out = _step(model, inputs)
        finally:
            set_receiver(previous)
        return heard, set(saved), out

    with kernels_on(kernels) as device:
        torch.manual_seed(0)
        model = MODELS[name]().to(device)
        calls = [_inputs(name, device, s) for s in range(4)]
        with torch.autocast(device.type, dtype=_autocast_dtype(device), enabled=autocast):
            monkeypatch.setattr(replay, "ENABLED", False)
            full = [noticed_and_saved(model, inputs) for inputs in calls]
            monkeypatch.setattr(replay, "ENABLED", True)
            before = dict(replay.counts)
            replayed = [noticed_and_saved(model, inputs) for inputs in calls]
    delta = {k: replay.counts[k] - before[k] for k in before}
    if not (name == "grouped" and kernels == "reference"):
        assert delta["replayed"] >= 2 and delta["refused"] == 0, delta
    for (heard_full, _, out_full), (heard, saved, out) in zip(full, replayed):
        assert [len(h) for h in heard] == [len(h) for h in heard_full]
        assert all(i in saved for h in heard for i in h)
        for a, b in zip(out_full, out):
            assert_bitwise(b, a)


def test_dropout_draws_a_fresh_mask_in_every_replay(monkeypatch):
    """A replay runs the random ops again: the same generator state gives the full path's mask,
    and the next state another mask (never a mask frozen at recording time)."""
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(H, H), ops.Dropout(0.5))
    x = torch.randn(8, H)

    def seeded_steps():
        out = []
        for seed in range(4):
            torch.manual_seed(100 + seed)
            out.append(_step(model, [x]))
        return out

    monkeypatch.setattr(replay, "ENABLED", False)
    full = seeded_steps()
    monkeypatch.setattr(replay, "ENABLED", True)
    before = replay.counts["replayed"]
    replayed = seeded_steps()
    assert replay.counts["replayed"] - before == 4
    for a, b in zip(full, replayed):
        for t, u in zip(a, b):
            assert_bitwise(u, t)
    assert not torch.equal(replayed[2][0], replayed[3][0])


def test_a_persistent_tensor_is_a_constant_and_an_effect_is_repeated():
    """A tensor made outside the call refuses the recording unless marked ``persistent`` (it
    lives for the process: a program may hold it); ``effect`` runs a host-side action that no
    dispatch mode sees, and the program repeats it on its own call's tensors."""
    outside, kept = torch.ones(3), replay.persistent(torch.full((3,), 2.0))
    _, refused = replay.record([torch.zeros(3)], lambda notice: torch.zeros(3) + outside, lambda out: [out])
    assert isinstance(refused, replay.Refusal) and "outside" in refused.reason
    seen = []
    x = torch.zeros(3)

    def body(notice):
        y = x + kept
        replay.effect(lambda t: seen.append(t), y)
        return y

    out, program = replay.record([x], body, lambda out: [out])
    assert isinstance(program, replay.Program) and torch.equal(out, torch.full((3,), 2.0)) and seen == [out]
    (again,) = program.run(torch.ones(3))
    assert torch.equal(again, torch.full((3,), 3.0)) and seen[-1] is again and len(seen) == 2
    replay.effect(lambda t: seen.append(t), x)  # outside a recording: just runs
    assert seen[-1] is x


@pytest.mark.gpu
def test_gpu_a_fresh_process_records_every_program_at_its_second_call():
    """In a fresh process the first program's first call comes before any launch: its layout
    key must be the one its second call sees (``launch.direct_state``), or that program records a
    step after the others (session 49: under ``FUSEOPS_CUDA_GRAPHS=all`` its consumers were then
    captured again). Two blocks, two steps: four programs recorded, none at the first."""
    code = """
import torch, fuseops
from fuseops import ops
from fuseops.ops.executor import replay
torch.manual_seed(0)
model = torch.nn.Sequential(*[fuseops.Sequential(ops.RMSNorm(64), ops.Linear(64, 64), ops.GELU())
                              for _ in range(2)]).cuda()
x = torch.randn(32, 64, device="cuda", requires_grad=True)
for step in range(2):
    model(x).sum().backward()
    print(replay.counts["recorded"])
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert done.stdout.split() == ["0", "4"], (done.stdout, done.stderr[-2000:])
