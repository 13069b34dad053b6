"""CUDA-graph replay of recorded programs (``fuseops/ops/executor/graphed.py``): where a program
is graphed, every call's outputs and gradients equal the full path's bit for bit, across
optimizer steps, replaced parameters, autocast's weight casts, NaNs and empty inputs; version
checks and an outer capture behave as without graphs. The GPU tests force the decision
(``GPU_BOUND``, ``KEEP`` and ``GPU_SLACK`` set to infinity) so that every graphable program is graphed; the
CPU tests pin the decision rule and the program's split around the weight cache."""

from __future__ import annotations

import collections
import copy
import os
import subprocess
import sys
import weakref

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.ops.executor import graph_pool, graphed, replay
from tests.helpers import assert_bitwise, changed_since, cuda_or_skip
from tests.ops.executor.test_graphed_states import (
    blocks,
    change_parameters,
    graph_states,
    moving_input_steps,
    recorded_programs,
    training_loop,
)
from tests.ops.executor.test_replay import MODELS, H, _inputs, _step

CALLS = 16  # 1 full, 1 recorded, 3 measured, 1 capturing, 3 on trial, then graphed
# Programs graphed per model, forward and backward (the grouped backward writes the gated
# gradient over the saved activation, an input of its program pinned in the forward graph's
# results: graphed since session 26).
_GRAPHED = {"dense_gelu": 2, "dense_swiglu_layernorm": 2, "residual_branch": 2, "grouped": 2}


@pytest.fixture
def always_graph(monkeypatch):
    monkeypatch.setattr(graphed, "ENABLED", True)
    monkeypatch.setattr(replay, "ENABLED", True)
    monkeypatch.setattr(graphed, "GPU_BOUND", float("inf"))
    monkeypatch.setattr(graphed, "KEEP", float("inf"))
    monkeypatch.setattr(graphed, "GPU_SLACK", float("inf"))


def _calls(name, device, dtype, kind):
    calls = []
    for seed in range(CALLS):
        inputs = [t.to(dtype) if t.is_floating_point() else t for t in _inputs(name, device, seed)]
        if kind == "nan" and seed % 2:
            inputs[0][1, 3] = float("nan")
            inputs[0][2, 0] = float("inf")
        calls.append(inputs)
    return calls


def _synced_steps(model, calls, change=None):
    """``_step`` on each call (synchronised, so the graph's timing events complete between
    calls); ``change(model, i)`` before call ``i``."""
    out = []
    for i, inputs in enumerate(calls):
        if change is not None:
            change(model, i)
        # Copies: a graphed call's results lie in graph memory, which its next replay reuses
        # only once they are gone (held, they would send every later call the eager way).
        out.append([None if t is None else t.clone() for t in _step(model, inputs)])
        torch.cuda.synchronize()
    return out


def _same_as_full_path(model, steps, monkeypatch) -> None:
    """``steps(m)`` (a list of tensor lists) on a copy of ``model`` with replay off, then on
    ``model`` with replay and graphs on: equal bit for bit."""
    reference = copy.deepcopy(model)
    monkeypatch.setattr(replay, "ENABLED", False)
    want = steps(reference)
    monkeypatch.setattr(replay, "ENABLED", True)
    got = steps(model)
    for i, (a, b) in enumerate(zip(want, got)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert_bitwise(y, x, f"call {i} tensor {j}")


def _compare(model, calls, monkeypatch, change=None):
    """``_synced_steps`` of ``calls`` with replay off, then with graphs (``_same_as_full_path``).
    Returns the graph counts' change."""
    before = dict(graphed.counts)
    _same_as_full_path(model, lambda m: _synced_steps(m, calls, change), monkeypatch)
    return {k: graphed.counts[k] - before[k] for k in before} | {"refusals": dict(graphed.refusals)}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["plain", "nan"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", MODELS)
def test_a_graphed_replay_equals_the_full_path(name, dtype, kind, always_graph, monkeypatch):
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = MODELS[name]().to(device, dtype)
    delta = _compare(model, _calls(name, device, dtype, kind), monkeypatch)
    # Forward and backward each: captured once, replayed from then on.
    assert delta["kept"] >= _GRAPHED[name] and delta["graph_replays"] >= 4 * _GRAPHED[name], str(delta)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["dense_gelu", "grouped"])
def test_an_eager_program_launches_with_kept_descriptor_expansions(name, dtype, monkeypatch):
    """Programs run eagerly (no graphs) hand their GEMMs' descriptors to the C launcher as the
    kept expansions (``DescriptorLaunch.expansion``, no descriptor object built a call), with
    the full path's results bit for bit; the dense GEMM pinned to the fused Triton kernel."""
    from fuseops.kernels import dense_dispatch
    from fuseops.kernels.launch_descriptors import DescriptorLaunch
    device = cuda_or_skip()
    monkeypatch.setattr(graphed, "ENABLED", False)
    monkeypatch.setattr(dense_dispatch, "_forced", dense_dispatch.Branch.FUSED)
    torch.manual_seed(0)
    model = MODELS[name]().to(device, dtype)
    _same_as_full_path(model, lambda m: _synced_steps(m, _calls(name, device, dtype, "plain")[:6]), monkeypatch)
    programs = recorded_programs(model)
    assert programs
    # A direct launch's fallback (after ``else``, taken only where a global the kernel read has
    # changed) passes descriptors; the direct launch before it never builds one.
    lines = [line for p in programs for line in p.source.splitlines()]
    assert not any("base=" in line.split(" else ")[0] for line in lines), lines
    namespaces = [p.run.__globals__.values() for p in programs]
    # Every descriptor-taking launch calls the C launcher itself, none the expanding wrapper.
    assert not any(isinstance(v, DescriptorLaunch) for values in namespaces for v in values)
    expansions = [v for values in namespaces for v in values if "expansion.<locals>" in getattr(v, "__qualname__", "")]
    # bf16 GEMMs load through TMA descriptors; float32 ones may load by pointer (the tiny grouped
    # GEMMs here do, taking no descriptor at all).
    if dtype == torch.bfloat16 or any("base=" in line for line in lines):
        assert expansions, lines


@pytest.mark.gpu
def test_a_held_result_is_never_overwritten(always_graph, monkeypatch):
    """Results held across calls (here: every output and gradient, never copied) keep their
    values: while one lives, the next call runs the program eagerly (``busy``)."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = MODELS["dense_gelu"]().to(device)
    calls = _calls("dense_gelu", device, torch.float32, "plain")

    def steps(m):
        held = []
        for i, inputs in enumerate(calls):
            held.append(_step(m, inputs))
            if i % 2:
                held[-1] = [None if t is None else t.clone() for t in held[-1]]  # every other call's let go
            torch.cuda.synchronize()
        return held

    before = dict(graphed.counts)
    _same_as_full_path(model, steps, monkeypatch)
    assert graphed.counts["busy"] > before["busy"] and graphed.counts["graph_replays"] > before["graph_replays"]


@pytest.mark.gpu
def test_gradient_accumulation_equals_the_full_path(always_graph, monkeypatch):
    """Two micro-batches' forwards before their backwards: the second finds the first's saved
    results alive and runs eagerly; gradients add up as without graphs."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = MODELS["dense_gelu"]().to(device)
    calls = _calls("dense_gelu", device, torch.float32, "plain")

    def steps(m):
        grads = []
        for i in range(0, len(calls), 2):
            for p in m.parameters():
                p.grad = None
            losses = [m(*[t.clone() for t in calls[k]]).square().sum() for k in (i, i + 1)]
            sum(losses).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
            torch.cuda.synchronize()
        return grads

    _same_as_full_path(model, steps, monkeypatch)


@pytest.mark.gpu
def test_a_block_applied_to_its_own_output_equals_the_full_path(always_graph, monkeypatch):
    """One block twice a step, the second call on the first's output (shared weights): the
    second call's input lies in the first's graph memory, alive, so it runs eagerly."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    block = fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, H), ops.GELU()).to(device)

    def steps(m):
        out = []
        for inputs in _calls("residual_branch", device, torch.float32, "plain"):
            for p in m.parameters():
                p.grad = None
            x = inputs[0].clone().requires_grad_()
            y = m(m(x))
            y.square().sum().backward()
            out.append([y.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in m.parameters()]])
            torch.cuda.synchronize()
        return out

    _same_as_full_path(block, steps, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("depth", [4, 12])
def test_a_chain_of_blocks_settles_without_dropping_a_graph(depth, always_graph, monkeypatch):
    """Blocks, each its own Sequential: a capture hands out its graph's results, which the
    consumer captured in the same step pins; every program is graphed, captured at most twice
    (the allocator may place the loss's gradient elsewhere once), and every call equals the
    full path (``test_graphed_states.py``: one capture each with the CPU stand-in)."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = blocks(depth).to(device)
    calls = [[t[0]] for t in _calls("residual_branch", device, torch.float32, "plain")] * 2
    delta = _compare(model, calls, monkeypatch)
    states = graph_states(model)
    assert delta["dropped"] == 0 and len(states) == 2 * depth, str(delta)
    assert all(g.phase == "graphed" and g.captures <= 2 for g in states), [(g.phase, g.captures) for g in states]


@pytest.mark.gpu
def test_an_input_that_moves_is_copied_from_then_on(always_graph, monkeypatch):
    """The input lies at one address until the graph is kept, then at three in turn: the
    program is captured again at once with that input copied, never measured again, and every
    call equals the full path."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = blocks(1).to(device)
    leaves = [torch.zeros(8, H, device=device, requires_grad=True) for _ in range(3)]
    values = [t[0] for t in _calls("residual_branch", device, torch.float32, "plain")]
    before = dict(graphed.counts)
    _same_as_full_path(model, moving_input_steps(leaves, values, torch.cuda.synchronize), monkeypatch)
    delta = {k: graphed.counts[k] - before[k] for k in before}
    assert delta["recaptured"] >= 1 and delta["dropped"] == 0 and delta["graph_replays"] >= 4, str(delta)


@pytest.mark.gpu
def test_a_user_loop_that_keeps_its_output_replays_every_program(always_graph, monkeypatch):
    """``out = model(x)`` stays bound until the next step reassigns it, an optimizer steps: the
    last block's output is found alive once and goes out as a copy from then on (a device copy
    into fresh memory), so every program replays in the last steps; every step equals the full
    path (``test_graphed_states.py`` has the same on the CPU, with a stand-in for graphs)."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = blocks(3).to(device)
    x = torch.randn(8, H, device=device)
    kept = {}

    def one_step(m, i):
        kept["out"] = m(x)  # bound until the next step's
        kept["out"].square().mean().backward()
        return [kept["out"].detach().clone(), *[p.grad.clone() for p in m.parameters()]]

    steps, tail = training_loop(one_step, sync=torch.cuda.synchronize)
    _same_as_full_path(model, steps, monkeypatch)
    assert tail["last"]["graph_replays"] == 5 * 6 and tail["last"]["busy"] == 0, str(tail["last"])


@pytest.mark.gpu
def test_idle_graphs_past_the_budget_give_their_memory_back(always_graph, monkeypatch):
    """A model through 4096 rows, then 64, with no memory for idle graphs (``graphed.budget``):
    the 64-row captures free the 4096-row graphs, their pools go back to the device (what stays
    allocated falls by at least the results they held), and every call equals the full path."""
    device = cuda_or_skip()
    monkeypatch.setattr(graphed, "idle_calls", lambda: 8)  # two steps of two blocks' programs
    monkeypatch.setattr(graphed, "budget", lambda device: 0)
    # This test's graphs only (an earlier test's, not yet collected, would be idle too).
    monkeypatch.setattr(graphed, "_holding", weakref.WeakSet())
    torch.manual_seed(0)
    model = blocks(2).to(device)
    calls = [[torch.randn(rows, H, device=device)] for rows in [4096] * 10 + [64] * 10]
    memory = {}

    def steps(m):
        out = _synced_steps(m, calls[:10])
        memory["held"] = graphed.held_bytes()
        memory["allocated"] = torch.cuda.memory_allocated()
        return out + _synced_steps(m, calls[10:])

    before = dict(graphed.counts)
    _same_as_full_path(model, steps, monkeypatch)
    delta = {k: graphed.counts[k] - before[k] for k in before}
    assert delta["evicted"] == 4, str(delta)  # each block's forward and backward at 4096 rows
    phases = sorted(g.phase for g in graph_states(model))
    assert phases == ["graphed"] * 4 + ["measuring"] * 4, phases
    assert memory["held"] > 0 and torch.cuda.memory_allocated() <= memory["allocated"] - memory["held"] // 2, (
        memory, torch.cuda.memory_allocated())


def _both_graphed(run_a, run_b, device):
    """Programs A and B on one 1024 x 1024 input, each graphed over ten calls equal to the plain
    calls; returns them and the input."""
    a = graphed.GraphedProgram(run_a, None, device)
    b = graphed.GraphedProgram(run_b, None, device)
    x = torch.randn(1024, 1024, device=device)
    for _ in range(10):
        assert_bitwise(a.run((x,))[0], run_a(x)[0], "A's result")
        assert_bitwise(b.run((x,))[0], run_b(x)[0], "B's result")
        torch.cuda.synchronize()
    assert a.phase == b.phase == "graphed", (a.phase, b.phase)
    return a, b, x


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["on", "off", "past_its_graph"])
def test_a_later_graphs_live_result_in_an_earlier_write_set_is_never_overwritten(rule, always_graph, monkeypatch):
    """Two programs in the device's shared graph pool (``graph_pool.py``): A's capture frees two
    4 MB intermediates, B's capture, next, places its 4 MB result in that memory. While the
    caller keeps B's result, A's call runs eagerly and the kept result stays as B made it; once
    it is dropped, A replays. With the rule off (control), A's replay overwrites it. The same
    where B is captured again while its result is kept (``past_its_graph``)."""
    device = cuda_or_skip()
    monkeypatch.setattr(graphed, "_holding", weakref.WeakSet())
    if rule == "off":
        monkeypatch.setattr(graph_pool, "clobbered", lambda clobbers: False)

    def run_a(x):
        return ((x * 2 + 1).sum(0),)

    def run_b(x):
        return (x * 3,)

    a, b, x = _both_graphed(run_a, run_b, device)
    assert a.pool is not None and a.pool is b.pool, "not in one shared pool"
    assert a.clobbers, "B's result does not lie in A's write set: the test shows nothing"
    assert not torch._C._cuda_isHistoryEnabled(), "the allocator's history was left on"
    before = dict(graphed.counts)
    (kept,) = b.run((x,))
    if rule == "past_its_graph":
        b._capture_again((x,), b._pinned_slots())
    (got,) = a.run((x,))
    torch.cuda.synchronize()
    if rule == "off":
        assert not torch.equal(kept, x * 3), "A's replay did not write where B's result lies"
        return
    assert_bitwise(kept, x * 3, "B's kept result")
    assert_bitwise(got, run_a(x)[0], "A's eager result")
    del kept, got
    assert_bitwise(a.run((x,))[0], run_a(x)[0], "A's result")
    delta = {k: graphed.counts[k] - before[k] for k in before}
    assert delta["clobbered"] == 1 and delta["graph_replays"] == 2, str(delta)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["on", "off"])
def test_a_result_dead_at_a_later_capture_is_reused_and_never_overwritten_alive(rule, always_graph, monkeypatch):
    """The shared pool reuses dead results (``graph_pool.py``): A's 4 MB result, dropped before
    B is captured, is given back, and B's 4 MB result goes where it lay. While the caller keeps
    A's result through B's call, B runs eagerly and the kept result stays as A made it; A's
    result kept for good goes out as a copy from then on and B replays again. A result alive at
    a capture is never reused (B's second result, captured while A's lives). With the rule off
    (control), B's replay overwrites A's kept result."""
    device = cuda_or_skip()
    monkeypatch.setattr(graphed, "_holding", weakref.WeakSet())
    monkeypatch.setattr(graph_pool, "_pools", {})
    if rule == "off":
        monkeypatch.setattr(graph_pool, "clobbered", lambda clobbers: False)

    def run_a(x):  # one kernel each: the pool holds their 4 MB results alone
        return (x * 2,)

    def run_b(x):
        return (x * 3,)

    a, b, x = _both_graphed(run_a, run_b, device)
    assert a.pool is not None and a.pool is b.pool and a.pool.reuses, "not in one pool that reuses"
    assert b.storages[0].data_ptr() == a.storages[0].data_ptr(), "A's dead result was not reused"
    assert [r.owner() for r in b.clobbers] == [a], "A's result is not noted in B's clobbers"
    before = dict(graphed.counts)
    (kept,) = a.run((x,))
    (got,) = b.run((x,))
    torch.cuda.synchronize()
    if rule == "off":
        assert not torch.equal(kept, x * 2), "B's replay did not write where A's result lies"
        return
    assert_bitwise(kept, x * 2, "A's kept result")
    assert_bitwise(got, x * 3, "B's eager result")
    del got
    for _ in range(4):  # A's result alive at its next call: copied out from then on; B replays
        (kept,) = a.run((x,))
        assert_bitwise(b.run((x,))[0], x * 3, "B's result")
        torch.cuda.synchronize()
        assert_bitwise(kept, x * 2, "A's kept result")
    delta = {k: graphed.counts[k] - before[k] for k in before}
    assert delta["clobbered"] == 1 and delta["copied_out"] == 1 and delta["graph_replays"] >= 6, str(delta)
    # A capture while A's result in graph memory lives (where B's old result lay): B captured
    # again never lands on it, and replays.
    a.run((x,))
    held = a.pool_results[0].detach()
    b._capture_again((x,), b._pinned_slots())
    assert not graph_pool.overlaps(b.writes, held.data_ptr(), held.data_ptr() + held.nbytes), "reused live memory"
    assert b.clobbers == [], [r.owner() for r in b.clobbers]
    assert_bitwise(b.run((x,))[0], x * 3, "B's result")
    torch.cuda.synchronize()
    assert_bitwise(held, x * 2, "A's result held")


@pytest.mark.gpu
def test_a_live_result_in_memory_given_back_is_covered_before_a_capture(always_graph, monkeypatch):
    """A's 4 MB result, dead when B (a small result) is captured, is given back; A's next replay
    hands it out again in memory the allocator sees free. While the caller keeps it, C (a 4 MB
    result, the size of that free block) is captured: the pool's cover takes the block first,
    so C's memory goes elsewhere and its replays leave the kept result as A made it."""
    device = cuda_or_skip()
    monkeypatch.setattr(graphed, "_holding", weakref.WeakSet())
    monkeypatch.setattr(graph_pool, "_pools", {})
    a = graphed.GraphedProgram(lambda x: (x * 2,), None, device)
    b = graphed.GraphedProgram(lambda x: (x.sum(0),), None, device)
    c = graphed.GraphedProgram(lambda x: (x * 3,), None, device)
    x = torch.randn(1024, 1024, device=device)
    for _ in range(10):
        assert_bitwise(a.run((x,))[0], x * 2, "A's result")
        assert_bitwise(b.run((x,))[0], x.sum(0), "B's result")
        torch.cuda.synchronize()
    assert a.phase == b.phase == "graphed" and a.pool.reuses, (a.phase, b.phase)
    (result,) = [r for r in a.pool.results if isinstance(r, graph_pool.Result) and r.owner() is a]
    assert not result.in_checkpoint, "A's dead result was not given back at B's capture"
    before = dict(graphed.counts)
    (kept,) = a.run((x,))
    assert kept.data_ptr() == result.start
    for _ in range(6):
        assert_bitwise(c.run((x,))[0], x * 3, "C's result")
        torch.cuda.synchronize()
        assert_bitwise(kept, x * 2, "A's result kept through C's capture and replays")
    assert c.phase in ("trial", "graphed") and c.captures == 1, (c.phase, c.captures)
    assert not graph_pool.overlaps(c.writes, result.start, result.end), "C's memory over A's live result"
    delta = {k: graphed.counts[k] - before[k] for k in before}
    assert delta["exposed"] == 0 and delta["graph_replays"] >= 2, str(delta)


@pytest.mark.gpu
def test_a_capture_under_the_callers_memory_history_gets_a_private_pool(always_graph, monkeypatch):
    """A caller recording the allocator's history (a memory profile) keeps it on through the
    captures, which go to private pools (a write set would mix with their trace)."""
    device = cuda_or_skip()
    monkeypatch.setattr(graphed, "_holding", weakref.WeakSet())
    x = torch.randn(256, 256, device=device)
    program = graphed.GraphedProgram(lambda t: (t * 2,), None, device)
    torch.cuda.memory._record_memory_history("all", context=None, stacks="python")
    try:
        for _ in range(10):
            assert_bitwise(program.run((x,))[0], x * 2, "the result")
            torch.cuda.synchronize()
        assert torch._C._cuda_isHistoryEnabled(), "the caller's history was turned off"
    finally:
        torch.cuda.memory._record_memory_history(None)
    assert program.phase == "graphed" and program.pool is None, (program.phase, program.pool)


@pytest.mark.gpu
def test_empty_inputs_are_graphed_too(always_graph, monkeypatch):
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = MODELS["dense_gelu"]().to(device)
    calls = [[torch.randn(0, H, device=device), torch.randn(0, H, device=device)] for _ in range(CALLS)]
    delta = _compare(model, calls, monkeypatch)
    assert delta["kept"] >= 2, str(delta)


@pytest.mark.gpu
@pytest.mark.parametrize("change", ["optimizer_step", "data_replaced"])
def test_graphs_follow_the_parameters(change, always_graph, monkeypatch):
    """Parameters are read in place: an optimizer's step reaches the next replay; a parameter
    given new storage (``param.data = ...``) makes the program capture again at once, the
    parameter pinned at its new address (``test_graphed_states.py`` checks it is not copied)."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = MODELS["dense_gelu"]().to(device)

    def step(m, i):
        change_parameters(m, i, change, replace_at=CALLS // 2)

    delta = _compare(model, _calls("dense_gelu", device, torch.float32, "plain") * 2, monkeypatch, step)
    if change == "data_replaced":
        assert delta["recaptured"] >= 2 and delta["captured"] >= 4 and delta["dropped"] == 0, str(delta)
    else:
        assert delta["kept"] >= 2, str(delta)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dense_gelu", "grouped"])
def test_autocast_casts_follow_the_weights(name, always_graph, monkeypatch):
    """Float32 weights under autocast: the weight cache's casts enter the graph as inputs,
    copied in only when the cache hands out a new cast (after each optimizer step here)."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = MODELS[name]().to(device)

    def step(m, i):
        if i % 3 == 0:
            with torch.no_grad():
                for p in m.parameters():
                    p.mul_(0.99)

    with torch.autocast("cuda", dtype=torch.bfloat16):
        delta = _compare(model, _calls(name, device, torch.float32, "plain"), monkeypatch, step)
    assert delta["kept"] >= _GRAPHED[name], str(delta)


@pytest.mark.gpu
def test_a_saved_input_changed_in_place_before_a_graphed_backward_raises(always_graph):
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, H)).to(device)
    _synced_steps(model, [[torch.randn(8, H, device=device)] for _ in range(CALLS)])
    before = graphed.counts["graph_replays"]
    y = model(torch.randn(8, H, device=device, requires_grad=True) * 1)
    assert graphed.counts["graph_replays"] == before + 1
    with torch.no_grad():
        model[1].weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.gpu
def test_an_outer_capture_runs_the_programs_eagerly(always_graph):
    """``make_graphed_callables`` over a model whose programs are graphed: its capture runs them
    eagerly (no graph inside a graph), and the caller's graph gives the eager results."""
    device = cuda_or_skip()
    torch.manual_seed(0)
    model = MODELS["dense_gelu"]().to(device)
    calls = _calls("dense_gelu", device, torch.float32, "plain")
    before = graphed.counts["kept"]
    _synced_steps(model, calls)
    assert graphed.counts["kept"] >= before + 2
    sample = [t.detach().clone().requires_grad_() for t in calls[0]]
    outer = torch.cuda.make_graphed_callables(model, tuple(sample))
    x = [t.detach().clone().requires_grad_() for t in calls[1]]
    y = outer(*x)
    y.square().sum().backward()
    ref_x = [t.detach().clone().requires_grad_() for t in calls[1]]
    ref = model(*ref_x)
    ref.square().sum().backward()
    assert_bitwise(y, ref, "output")
    for a, b in zip(x, ref_x):
        assert_bitwise(a.grad, b.grad, "input grad")


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["one_address", "fresh_each_step"])
def test_the_default_graphs_a_gpu_bound_program_where_its_graph_copies_almost_nothing(where, monkeypatch):
    """``FUSEOPS_CUDA_GRAPHS=1`` on programs the GPU bounds (two 4096-wide GEMMs of 32,768 rows a
    direction, far past ``GPU_BOUND`` times their host time; session 52: with 8,192 rows both
    programs measured host-bound in two runs of the graphs part, though not alone): with the
    input at one address the forward and backward are graphed and kept; with a fresh input
    tensor each step (as the MoE composition's permuted rows) their graphs would copy it (most
    of the forward's bytes), so the GPU-bound ones stay eager, uncaptured. Every step equals the
    full path bit for bit."""
    device = cuda_or_skip()
    for name, value in (("GPU_BOUND", graphed.gpu_bound_from_env("1")),
                        ("GPU_BOUND_COPIES", graphed.gpu_bound_copies_from_env("1")), ("ENABLED", True)):
        monkeypatch.setattr(graphed, name, value)
    monkeypatch.setattr(replay, "ENABLED", True)
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.Linear(4096, 4096), ops.GELU(), ops.Linear(4096, 4096)).to(device, torch.bfloat16)
    x0 = torch.randn(32768, 4096, device=device, dtype=torch.bfloat16)

    def steps(m):
        out, last = [], None
        for _ in range(CALLS):
            for p in m.parameters():
                p.grad = None
            # A fresh copy made while the last one lives: at another address each step.
            x = x0 if where == "one_address" else x0.clone()
            last = x  # noqa: F841 (held until the next step's copy is made)
            y = m(x)
            y.sum().backward()  # dy a stride-0 view: a graph copies one element of it
            out.append([y.detach().clone(), *[p.grad.clone() for p in m.parameters()]])
            del y
            torch.cuda.synchronize()
        return out

    before = dict(graphed.refusals)
    _same_as_full_path(model, steps, monkeypatch)
    states = [(g.phase, g.gpu_bound, g.captures) for g in graph_states(model)]
    # What the rule said of these programs: a failure names the reasons (session 52: the first
    # failure's log was lost).
    said = changed_since(before, graphed.refusals)
    # The forward at least is GPU-bound; the backward measured host-bound in one run (session 51,
    # run 1: a first process's timings), and a host-bound program is graphed by the rule before.
    assert len(states) == 2 and any(bound for _, bound, _ in states), (states, said)
    if where == "one_address":
        assert all(phase == "graphed" for phase, _, _ in states), (states, said)
    else:
        assert all((phase, captures) == ("eager", 0) for phase, bound, captures in states if bound), states
        reason = "a GPU-bound program whose graph would copy its inputs"
        assert graphed.refusals.get(reason, 0) > before.get(reason, 0)


def test_the_decision_rule():
    """Steps 1 and 3 of the module docstring, on (enqueue s, GPU span s) samples of the eager
    program and (enqueue s, GPU span s, of which copies s) of its graph."""
    host_bound = [(1e-3, 1.1e-3), (1.2e-3, 1.2e-3), (0.9e-3, 1.0e-3)]
    gpu_bound = [(1e-3, 5e-3), (1e-3, 5e-3), (1e-3, 5e-3)]
    assert graphed.decision(host_bound, None) == "capture"
    assert graphed.decision(gpu_bound, None) == "eager"
    assert graphed.decision(host_bound, [(1e-4, 3e-4, 0.0)] * 3) == "keep"
    # Where the GPU was behind, the eager span was its own work: a graph that keeps it keeps it.
    assert graphed.decision([(1e-3, 0.8e-3)] * 3, [(1e-4, 0.82e-3, 0.0)] * 3) == "keep"
    # The graph's copies lengthened the call past GPU_SLACK; its host time did not shrink.
    assert graphed.decision(host_bound, [(1e-4, 1.2e-3, 0.9e-3)] * 3) == "drop"
    # A host-bound program's copies may fill the GPU time the host left idle.
    assert graphed.decision([(1e-3, 0.4e-3)] * 3, [(1e-4, 0.9e-3, 0.5e-3)] * 3) == "keep"
    # A GPU-bound program's graph may not lengthen the GPU's work (session 47, call 7: 0.92 ms
    # enqueue and 3.6 ms of GPU work eager, 3.9 ms with six copied inputs, kept by the rule before).
    gpu_heavy = [(0.92e-3, 3.6e-3), (3.35e-3, 3.6e-3), (3.31e-3, 3.6e-3)]
    assert graphed.decision(gpu_heavy, None) == "capture"
    copied = [(0.24e-3, 3.9e-3, 0.3e-3), (0.25e-3, 3.97e-3, 0.32e-3), (0.28e-3, 4.03e-3, 0.33e-3)]
    assert graphed.decision(gpu_heavy, copied) == "drop"
    # Without copies it keeps the GPU's work and saves host time: its span counts as at most
    # the eager one's, the same kernels (session 49, run 6: 1.548-1.727 ms for three replays of
    # one graph, noise beyond GPU_SLACK).
    assert graphed.decision(gpu_heavy, [(0.05e-3, 3.62e-3, 0.0)] * 3) == "keep"
    noisy = [(0.05e-3, 3.75e-3, 0.0), (0.05e-3, 3.9e-3, 0.0), (0.05e-3, 3.8e-3, 0.0)]
    assert graphed.decision(gpu_heavy, noisy) == "keep"
    assert graphed.decision(gpu_heavy, [(0.05e-3, 3.75e-3, 0.05e-3)] * 3) == "keep"
    assert graphed.decision(gpu_heavy, [(0.05e-3, 3.75e-3, 0.15e-3)] * 3) == "drop"
    # Eager samples from before the inputs moved (other work, perhaps): its own span.
    assert graphed.decision(gpu_heavy, noisy, same_work=False) == "drop"
    assert graphed.decision(host_bound, [(0.95e-3, 3e-4, 0.0)] * 3) == "drop"
    # A host that ran ahead until its launches waited for the queue to drain: those enqueue times
    # are the GPU's pace (session 40, call 15: 0.2 ms, then 3.0-3.1 ms, for 2.9 ms of GPU work).
    throttled = [(0.2e-3, 2.93e-3), (3.02e-3, 2.93e-3), (3.1e-3, 2.94e-3)]
    assert graphed.decision(throttled, None) == "eager"
    assert graphed.decision(host_bound, [(1e-4, 3e-4, 0.0), (0.9e-3, 3e-4, 0.0), (0.9e-3, 3e-4, 0.0)]) == "keep"


def test_the_cuda_graphs_modes(monkeypatch):
    """``FUSEOPS_CUDA_GRAPHS``: ``1`` (the default) lets a GPU-bound program capture where its graph
    copies at most 1 % of its inputs' bytes (``GPU_BOUND_COPIES``), ``host`` keeps GPU-bound programs
    eager, ``all`` captures them whatever they copy (``GPU_BOUND`` infinite; step 3 judges each graph
    as any other); other values are refused, naming the variable."""
    assert graphed.gpu_bound_from_env("1") == graphed.gpu_bound_from_env("host") == 4.0
    assert graphed.gpu_bound_from_env("all") == float("inf")
    assert graphed.gpu_bound_copies_from_env("1") == 0.01
    assert graphed.gpu_bound_copies_from_env("host") is None
    assert graphed.gpu_bound_copies_from_env("all") == float("inf")
    for read in (graphed.gpu_bound_from_env, graphed.gpu_bound_copies_from_env):
        with pytest.raises(ValueError, match=r"FUSEOPS_CUDA_GRAPHS='yes': expected '1' .* 'host' .* 'all' .* or '0'"):
            read("yes")
    gpu_bound = [(1e-3, 5e-3)] * 3
    monkeypatch.setattr(graphed, "GPU_BOUND", graphed.gpu_bound_from_env("1"))
    assert graphed.decision(gpu_bound, None) == "eager"
    monkeypatch.setattr(graphed, "GPU_BOUND", graphed.gpu_bound_from_env("all"))
    assert graphed.decision(gpu_bound, None) == "capture"
    assert graphed.decision(gpu_bound, [(1e-4, 5.1e-3, 0.0)] * 3) == "keep"
    # Read at import, as ENABLED is.
    code = ("from fuseops.ops.executor import graphed; "
            "print(graphed.ENABLED, graphed.GPU_BOUND, graphed.GPU_BOUND_COPIES)")
    for mode, expected in (("all", ["True", "inf", "inf"]), ("host", ["True", "4.0", "None"]),
                           ("1", ["True", "4.0", "0.01"])):
        env = dict(os.environ, FUSEOPS_CUDA_GRAPHS=mode, PYTHONPATH=os.pathsep.join(sys.path))
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                              check=False)
        assert done.stdout.split() == expected, (mode, done.stderr[-2000:])


def test_the_split_around_the_weight_cache_computes_the_program(monkeypatch):
    """Under autocast with float32 weights, ``prologue`` asks the cache for the casts and
    ``body`` runs every other line on them: together, the program's results bit for bit."""
    monkeypatch.setattr(replay, "ENABLED", True)
    split = []
    monkeypatch.setattr(graphed, "for_program", lambda program, inputs, reason, parts: split.append(
        (program, parts(), reason)))
    torch.manual_seed(0)
    model = MODELS["dense_gelu"]()
    calls = [_inputs("dense_gelu", torch.device("cpu"), s) for s in range(3)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for inputs in calls:
            _step(model, inputs)
    forward, parts, reason = split[0]
    assert reason is None and parts.num_derived == 4  # two Linears: weight and bias
    inputs = [calls[2][0], calls[2][1], *model.parameters()]
    with torch.no_grad():
        whole = forward.run(*inputs)
        pieces = parts.body(*inputs, *parts.prologue(*inputs))
    for a, b in zip(whole, pieces):
        assert_bitwise(b, a, "split result")


def test_random_ops_are_never_graphed(monkeypatch):
    monkeypatch.setattr(replay, "ENABLED", True)
    before = graphed.refusals.get("a random op (aten.bernoulli_.float)", 0) + graphed.refusals.get(
        "a random op (aten.native_dropout.default)", 0)
    model = fuseops.Sequential(ops.Linear(H, H), ops.Dropout(0.5))
    for _ in range(3):
        _step(model, [torch.randn(8, H)])
    after = graphed.refusals.get("a random op (aten.bernoulli_.float)", 0) + graphed.refusals.get(
        "a random op (aten.native_dropout.default)", 0)
    assert after > before, graphed.refusals


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "expanded", "sliced", "empty"])
def test_a_copied_input_keeps_its_strides(layout):
    """A copied slot's buffer holds the storage range its tensor covers, so the graph sees the
    recorded strides (the layout key holds them) and the same values, whatever the layout."""
    base = torch.arange(48.0).reshape(6, 8)
    t = {"contiguous": base, "transposed": base.t(), "expanded": base[:, :1].expand(6, 5),
         "sliced": base[1:5, 2:7], "empty": base[:0]}[layout]
    buffer = torch.empty(graphed._span(t), dtype=t.dtype)
    buffer.copy_(graphed._covering(t))
    static = buffer.as_strided(t.shape, t.stride(), 0)
    assert static.stride() == t.stride() and torch.equal(static, t)


def test_results_are_compared_by_their_bits():
    nan = torch.tensor([1.0, float("nan"), -0.0])
    assert graphed.same_bits(nan, nan.clone())
    assert not graphed.same_bits(nan, torch.tensor([1.0, float("nan"), 0.0]))  # -0.0 and 0.0 differ in bits
    c = torch.randn(3, dtype=torch.complex128)
    assert graphed.same_bits(c, c.clone()) and graphed.same_bits(None, None) and not graphed.same_bits(c, None)


def test_a_graph_freed_leaves_a_later_graphs_results_at_its_addresses_in_graph_memory(monkeypatch):
    """A capture may place its results where an earlier graph's dead results lie (the shared
    pool's reuse): freeing the earlier graph keeps the later one's there in graph memory, so its
    consumers' inputs count as staying put (session 49, run 11: three backward programs found
    theirs "moved out of graph memory" that way, ran eagerly and were captured again)."""
    monkeypatch.setattr(graphed, "_graph_memory", collections.Counter())
    storage = torch.empty(8)
    earlier_result, later_result = storage[:4], storage.view(2, 4)  # one address
    earlier = graphed.GraphedProgram(lambda: (), None, torch.device("cpu"))
    later = graphed.GraphedProgram(lambda: (), None, torch.device("cpu"))
    earlier.pool_results = [earlier_result]
    graphed._enter_graph_memory(earlier.pool_results)
    later.pool_results = [later_result]
    graphed._enter_graph_memory(later.pool_results)
    earlier._forget_results()
    assert graphed.in_graph_memory(later_result)
    later._forget_results()
    assert not graphed.in_graph_memory(later_result) and not graphed._graph_memory


def test_a_moved_input_is_copied_by_where_it_came_from(monkeypatch):
    """A pinned slot that moved between allocator-placed addresses is copied from the next
    capture on; one that left another graph's results (its producer ran eagerly) only at its
    second move; one that moved into another graph's results stays pinned."""
    state = graphed.GraphedProgram(lambda: (), None, torch.device("cpu"))
    elsewhere, graph_result = 1 << 40, 1 << 41
    monkeypatch.setattr(graphed, "_graph_memory", collections.Counter([graph_result]))
    state.from_graphs = {1}
    state._note_move(0, elsewhere)
    state._note_move(1, elsewhere)
    state._note_move(2, graph_result)
    assert state.unsettled == {0}
    state._note_move(1, elsewhere)
    state._note_move(2, graph_result)
    assert state.unsettled == {0, 1}
