"""The graph states of recorded programs (``fuseops/ops/executor/graphed.py``) on the CPU: measuring,
capturing, on trial, graphed, captured again after an input moved, busy while a result lives. A
stand-in for CUDA graphs keeps their semantics that the states rely on: capturing runs the body once
before and once in the capture, and the captured results stay where they are, overwritten by each
replay (here: the body runs again and its results are copied into them). So the CPU suite checks the
state machine bit for bit against the full path; the GPU tests (test_graphed.py) check real graphs."""

from __future__ import annotations

import collections
import copy
import gc
import random
import time
import weakref
from typing import ClassVar

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.ops.executor import graphed, replay
from tests.helpers import assert_bitwise, changed_since
from tests.ops.executor.test_replay import MODELS, H, _inputs, _step

# The inputs of the call being captured or replayed (set by the fixture around those methods).
_CALL: dict[str, tuple] = {}


class _StandInGraph:
    """Holds nothing a real graph would not: a pinned input is read from the call replaying (at
    the same address, as ``_replay`` checked), so its producer's results are not kept alive; a
    copied input is the graph's own buffer; results in graph memory are kept and overwritten."""

    def __init__(self, body, args, results) -> None:
        self.body, self.args, self.results = body, args, results

    def replay(self) -> None:
        inputs = _CALL["inputs"]
        args = [inputs[arg] if isinstance(arg, int) else arg for arg in self.args]
        for kept, fresh in zip(self.results, self.body(*args)):
            if kept is not None:
                kept.copy_(fresh)


def _stand_in_capture(body, static, device, after_warm_up, pool):
    body(*static)  # as the real capture's warm-up
    after_warm_up()
    results = body(*static)
    after_warm_up()  # a real capture runs nothing: the inputs stay as they were
    inputs = _CALL["inputs"]
    # A pinned input is the call's own tensor: remembered by its position, not held.
    args = [next((i for i, x in enumerate(inputs) if x is t), t) if t is not None else None for t in static]
    static_storages = {t.untyped_storage().data_ptr() for t in static if t is not None}
    kept = [None if r is None or r.untyped_storage().data_ptr() in static_storages else r for r in results]
    # A shared pool's write set: empty (no graph writes where another's results lie); a private
    # pool (``pool`` None): none.
    return _StandInGraph(body, args, kept), results, (() if pool is not None else None)


class _StandInTimed:
    """Host time for both samples: every program is host-bound by the rule (the thresholds are
    infinite here anyway)."""

    def __init__(self) -> None:
        self.end = self
        self.host = time.perf_counter()

    def stop(self):
        self.host = time.perf_counter() - self.host
        return self

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def after_copies(self) -> None:
        self.copied = True

    def sample(self) -> tuple[float, float, float]:
        return self.host, self.host, 0.0


class _RandomTimed(_StandInTimed):
    """Samples drawn from a seeded generator (``random_verdicts``)."""

    draws = random.Random(0)

    def sample(self) -> tuple[float, float, float]:
        return self.draws.uniform(1, 5), self.draws.uniform(0.5, 6), 0.0


# The thresholds ``cpu_graphs`` sets infinite (every program host-bound, every graph kept), as the
# library has them.
_REAL_THRESHOLDS = {name: getattr(graphed, name) for name in ("GPU_BOUND", "KEEP", "GPU_SLACK")}


def random_verdicts(seed: int, monkeypatch) -> None:
    """Under ``cpu_graphs``: each timed call's samples drawn at random, judged by the real
    thresholds, so that each program's verdicts (host-bound or GPU-bound, graph kept or judged
    slower, measured again) come by chance, as a GPU's noise on a busy host gives them."""
    for name, value in _REAL_THRESHOLDS.items():
        monkeypatch.setattr(graphed, name, value)
    monkeypatch.setattr(_RandomTimed, "draws", random.Random(seed))
    monkeypatch.setattr(graphed, "_Timed", _RandomTimed)


@pytest.fixture
def cpu_graphs(monkeypatch):
    # Pinned inputs are found by their addresses. A garbage collection in the middle of a test,
    # freeing the cycles a torch.compile test before it left, moves where the CPU allocator places
    # the test's tensors: collected first. (Not held off: the interpreter's cycles hold results.)
    gc.collect()
    monkeypatch.setattr(graphed, "DEVICE_TYPES", frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(graphed, "capture", _stand_in_capture)
    monkeypatch.setattr(graphed, "_Timed", _StandInTimed)
    monkeypatch.setattr(graphed, "ENABLED", True)
    monkeypatch.setattr(replay, "ENABLED", True)
    for name in ("GPU_BOUND", "KEEP", "GPU_SLACK"):
        monkeypatch.setattr(graphed, name, float("inf"))
    monkeypatch.setattr(graphed, "_graph_memory", collections.Counter())
    # This test's graphs only (an earlier test's, not yet collected, would count as idle).
    monkeypatch.setattr(graphed, "_holding", weakref.WeakSet())
    for method in ("_capture", "_replay"):
        real = getattr(graphed.GraphedProgram, method)

        def wrapped(self, inputs, real=real):
            outer = dict(_CALL)
            _CALL["inputs"] = tuple(inputs)
            # Which inputs are parameters (not the inputs: held, they would keep results alive).
            self.param_slots = {i for i, t in enumerate(inputs) if isinstance(t, torch.nn.Parameter)}
            try:
                return real(self, inputs)
            finally:
                _CALL.clear()
                _CALL.update(outer)
        monkeypatch.setattr(graphed.GraphedProgram, method, wrapped)


def _delta(before: dict) -> dict:
    return {k: graphed.counts[k] - before[k] for k in before}


def _same_as_full_path(model, steps, monkeypatch) -> dict:
    """``steps(m)`` with replay off on a copy of ``model``, then with graphs: equal bit for bit.
    Returns the graph counts' change."""
    reference = copy.deepcopy(model)
    monkeypatch.setattr(replay, "ENABLED", False)
    want = steps(reference)
    monkeypatch.setattr(replay, "ENABLED", True)
    before = dict(graphed.counts)
    got = steps(model)
    for i, (a, b) in enumerate(zip(want, got)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert_bitwise(y, x, f"call {i} tensor {j}")
    return _delta(before)


def _steps(calls):
    def steps(m):
        # Copies: a graphed call's results are overwritten by its next replay.
        return [[None if t is None else t.clone() for t in _step(m, inputs)] for inputs in calls]
    return steps


def blocks(n: int) -> torch.nn.Module:
    """``n`` pre-norm blocks, each its own ``fuseops.Sequential`` (its own programs)."""
    return torch.nn.Sequential(*[fuseops.Sequential(ops.RMSNorm(H), ops.Linear(H, H), ops.GELU()) for _ in range(n)])


def training_loop(one_step, set_to_none=lambda i: True, sync=lambda: None, steps=30, last=5):
    """``(steps(m), tail)``: ``steps`` runs ``one_step(m, i)`` (the tensors it returns are
    compared), an SGD step and ``zero_grad(set_to_none=set_to_none(i))`` ``steps`` times;
    ``tail["last"]`` is then the graph counts' change over the ``last`` steps."""
    tail = {}

    def run(m):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        seen = []
        for i in range(steps):
            if i == steps - last:
                tail["before"] = dict(graphed.counts)
            seen.append(one_step(m, i))
            opt.step()
            opt.zero_grad(set_to_none=set_to_none(i))
            sync()
        tail["last"] = _delta(tail["before"])
        return seen
    return run, tail


def moving_input_steps(leaves, values, sync=lambda: None):
    """``steps(m)``: one block step a value, the input a leaf at one address for 10 calls, then
    the three leaves in turn."""
    def steps(m):
        out = []
        for i, v in enumerate(values):
            x = leaves[0] if i < 10 else leaves[i % 3]
            with torch.no_grad():
                x.copy_(v)
            for leaf in leaves:
                leaf.grad = None  # a gradient kept from an earlier call would keep the backward busy
            for p in m.parameters():
                p.grad = None
            y = m(x)
            y.square().sum().backward()
            out.append([y.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in m.parameters()]])
            del y  # a live result of the last replay would send the next call the eager way
            sync()
        return out
    return steps


def change_parameters(m: torch.nn.Module, i: int, change: str, replace_at: int) -> None:
    """Before call ``i``: "optimizer_step" steps every parameter in place; "data_replaced"
    gives each new storage (``param.data = ...``) at call ``replace_at``."""
    if change == "optimizer_step" or i == replace_at:
        with torch.no_grad():
            for p in m.parameters():
                if change == "optimizer_step":
                    p.add_(p * 0.01 + 0.001 * i)
                else:
                    p.data = p.data * 0.5 + 0.25


# On the CPU the grouped model's split sizes are host tensors, whose values its calls read: it is
# never recorded there, so it has no program to graph (the GPU tests cover it).
_RECORDED_ON_CPU = [name for name in MODELS if name != "grouped"]


@pytest.mark.parametrize("kind", ["plain", "nan", "empty"])
@pytest.mark.parametrize("name", _RECORDED_ON_CPU)
def test_graphed_calls_equal_the_full_path(name, kind, cpu_graphs, monkeypatch):
    """Every call of a graphed program equals the full path bit for bit, with NaNs and
    infinities, and with zero rows (empty results are handed out as new empty tensors: every
    empty storage lies at address 0, so matching them to inputs by address would be wrong).
    Calls enough for a program to settle after a few of its inputs moved (the CPU allocator
    places a step's tensors by what earlier tests left: each move is a capture and a new trial;
    session 30's suite saw four in 14 calls)."""
    torch.manual_seed(0)
    model = MODELS[name]()
    calls = []
    for seed in range(24):
        inputs = _inputs(name, torch.device("cpu"), seed)
        if kind == "nan" and seed % 2:
            inputs[0][1, 3] = float("nan")
            inputs[0][2, 0] = float("-inf")
        if kind == "empty":
            inputs = [t[:0] if t is not None and t.dim() and t.shape[0] == inputs[0].shape[0] else t
                      for t in inputs]
        calls.append(inputs)
    delta = _same_as_full_path(model, _steps(calls), monkeypatch)
    assert delta["kept"] >= 1 and delta["graph_replays"] >= 4, str(delta)


class _GradientAtOneAddress(torch.autograd.Function):
    """The identity, whose backward hands on the incoming gradient from one buffer: the last
    block's ``dy`` then lies at one address in every call, as the model's input does."""

    @staticmethod
    def forward(ctx, y, buffer):
        ctx.buffer = buffer
        return y.clone()

    @staticmethod
    def backward(ctx, dy):
        return ctx.buffer.copy_(dy), None


def fixed_address_steps(values):
    """``steps(m)``: one step per value with every input a program sees from outside the graphs
    at one address (the input a leaf copied into, the last block's ``dy`` from one buffer), so
    that no input moves by where the CPU allocator places a fresh tensor."""
    x = torch.zeros(8, H, requires_grad=True)
    dy = torch.empty(8, H)

    def steps(m):
        out = []
        for v in values:
            with torch.no_grad():
                x.copy_(v)
            x.grad = None
            for p in m.parameters():
                p.grad = None
            y = _GradientAtOneAddress.apply(m(x), dy)
            y.square().sum().backward()
            out.append([y.detach(), x.grad.clone(), *[p.grad.clone() for p in m.parameters()]])
            del y
        return out
    return steps


@pytest.mark.parametrize("depth", [4, 12])
def test_a_chain_of_blocks_settles_with_one_capture_a_program(depth, cpu_graphs, monkeypatch):
    """Each block its own Sequential: a capture hands out its graph's results, so the consumer
    captured in the same step pins them where every replay writes them, and nothing is captured
    twice (session 26: the eager results, handed out before, sent a 24-block stack's consumers
    to capture again in a cascade, 21 of 48 programs eager for good on a GPU). The inputs from
    outside the graphs lie at one address: a fresh tensor that the CPU allocator once placed
    elsewhere would rightly capture its program and those downstream again (CI, session 36:
    the cloned input of a 4-block chain moved once, and all 8 programs were captured twice)."""
    torch.manual_seed(0)
    model = blocks(depth)
    values = [_inputs("residual_branch", torch.device("cpu"), seed)[0] for seed in range(12)]
    delta = _same_as_full_path(model, fixed_address_steps(values), monkeypatch)
    states = graph_states(model)
    assert delta["dropped"] == 0 and delta["recaptured"] == 0, str(delta)
    assert [(g.phase, g.captures) for g in states] == [("graphed", 1)] * 2 * depth


@pytest.mark.parametrize("loop", ["plain", "accumulate", "eval"])
@pytest.mark.parametrize("seed", range(3))
def test_any_verdicts_settle(seed, loop, cpu_graphs, monkeypatch):
    """Whatever the timings decide (``random_verdicts``), a 6-block stack in a training loop (an
    SGD step each step; two micro-batches a step; a forward without grad after each step, its
    output held to the next) equals the full path bit for bit while its states measure, capture,
    drop and go eager, and then settles: a step captures nothing and no graph state is made afresh.
    (Session 57 found a routing-graphs loop that never settled this way: ``tests/moe``.)"""
    random_verdicts(seed, monkeypatch)
    torch.manual_seed(0)
    model = blocks(6)
    xs = [_inputs("residual_branch", torch.device("cpu"), s)[0].requires_grad_() for s in range(2)]
    held = []

    def one_step(m, i):
        batches = xs if loop == "accumulate" else xs[:1]
        ys = [m(x) for x in batches]
        sum(y.square().sum() for y in ys).backward()
        out = [*(y.detach() for y in ys), *(p.grad.clone() for p in m.parameters())]
        if loop == "eval":
            with torch.no_grad():
                held[:] = [m(xs[1])]
            out.append(held[0].clone())
        return out
    steps, _ = training_loop(one_step, steps=40)
    _same_as_full_path(model, steps, monkeypatch)
    made = set(map(id, graph_states(model)))
    from benchmarks._timing import until_graphs_settle

    until_graphs_settle(lambda: steps(model), lambda: None, limit=3)
    before = dict(graphed.counts)
    steps(model)
    assert _delta(before)["captured"] == 0 and set(map(id, graph_states(model))) == made


def test_the_benchmarks_warm_up_ends_once_the_graph_states_have_settled(cpu_graphs):
    """``benchmarks._timing.until_graphs_settle``, which the benchmarks and the GPU offload test
    run before they time or forbid host syncs: after it, steps capture nothing (a capture syncs
    the host) and every program replays its graph; a step whose states never settle fails it."""
    from benchmarks._timing import until_graphs_settle

    torch.manual_seed(0)
    model = blocks(3)
    steps = fixed_address_steps([_inputs("residual_branch", torch.device("cpu"), 0)[0]])  # one step a call
    ran = until_graphs_settle(lambda: steps(model), lambda: None)
    assert graphed.MEASURED_CALLS < ran < 40
    before = dict(graphed.counts)
    steps(model)
    delta = _delta(before)
    assert delta.pop("graph_replays") == 2 * 3 and not any(delta.values()), str(delta)
    assert [g.phase for g in graph_states(model)] == ["graphed"] * 2 * 3

    fresh = blocks(1)  # measured for three calls, captured at the fourth, on trial for three more
    with pytest.raises(RuntimeError, match="did not settle in 5 steps"):
        until_graphs_settle(lambda: steps(fresh), lambda: None, limit=5)
    # ``fresh``'s states still measure, but a step that does not call them is settled.
    since = graphed.calls()
    assert graphed.settling(since - 2) == 2
    steps(model)
    assert graphed.settling(since) == 0


def test_an_input_that_moves_is_copied_from_then_on(cpu_graphs, monkeypatch):
    """The input lies at one address until the graph is kept, then at three in turn: captured
    again at once with that input copied, never measured again."""
    torch.manual_seed(0)
    model = blocks(1)
    leaves = [torch.zeros(8, H, requires_grad=True) for _ in range(3)]
    values = [_inputs("residual_branch", torch.device("cpu"), seed)[0] for seed in range(16)]
    delta = _same_as_full_path(model, moving_input_steps(leaves, values), monkeypatch)
    assert delta["recaptured"] >= 1 and delta["dropped"] == 0 and delta["graph_replays"] >= 4, str(delta)
    assert any(g.unsettled for g in graph_states(model)), "the moved input was not copied"


@pytest.mark.parametrize("where", ["one_address", "moving"])
def test_a_program_writing_into_its_input(where, cpu_graphs):
    """As the grouped MLP's backward writes dz over the saved z (a forward graph's result, at one
    address): the program writes into an input and hands out a view of it. Where the input lies
    at one address the program is graphed: the capture's runs each get the input as it came, and
    every call's results, and what it leaves in the input, equal the eager run's. Where it moves,
    the program stays eager (a graph would write into its own copy)."""
    def run(z, w):
        dz = torch.mul(z, w, out=z)
        return dz[1:], (dz * 2).sum(0)

    torch.manual_seed(0)
    w = torch.randn(4, 3)
    z = torch.empty(4, 3)
    program = graphed.GraphedProgram(run, None, torch.device("cpu"))
    before = dict(graphed.refusals)
    for _ in range(12):
        value = torch.randn(4, 3)
        if where == "moving":
            z = torch.empty(4, 3)
        z.copy_(value)
        got = program.run((z, w))
        want = run(value.clone(), w)
        for k in range(2):
            assert_bitwise(got[k], want[k], f"result {k}")
        assert_bitwise(z, value * w, "the input written")
        assert got[0].data_ptr() == z.data_ptr() + 3 * z.element_size(), "the view is not of the call's input"
        del got  # a live result of the last replay would send the next call the eager way
    if where == "one_address":
        assert program.phase == "graphed" and program.captures == 1
    else:
        assert program.phase == "eager"
        assert graphed.refusals.get("a kernel writing into an input that moves", 0) > before.get(
            "a kernel writing into an input that moves", 0)


def _times(x, w):
    return (x * w,)


def _a_multiplying_program() -> tuple[graphed.GraphedProgram, torch.Tensor]:
    """A program ``x * w`` on the CPU (graphed through the stand-in), and its ``w``."""
    torch.manual_seed(0)
    return graphed.GraphedProgram(_times, None, torch.device("cpu")), torch.randn(4, 3)


def _call_checked(program: graphed.GraphedProgram, x: torch.Tensor, w: torch.Tensor, i: int) -> None:
    """One call of ``_a_multiplying_program``'s program, equal to the eager run; its result is
    dropped on return (a live result of the last replay would send the next call the eager way)."""
    got = program.run((x, w))
    assert_bitwise(got[0], x * w, f"call {i}")


def test_a_host_ahead_of_the_gpu_times_only_the_measured_calls(cpu_graphs, monkeypatch):
    """While the timed runs are not complete (the GPU behind the host), later calls run untimed:
    no more than ``MEASURED_CALLS`` are held, so a host running far ahead piles up no events and
    the verdict rests on the first calls' samples. Every call equals the eager run."""
    done = {"gpu": False}

    class Timed(_StandInTimed):
        def query(self):
            return done["gpu"]

    monkeypatch.setattr(graphed, "_Timed", Timed)
    # (Where GPU-bound programs may capture, "1" and "all", it waits: below.)
    monkeypatch.setattr(graphed, "GPU_BOUND", graphed.gpu_bound_from_env("host"))
    monkeypatch.setattr(graphed, "GPU_BOUND_COPIES", graphed.gpu_bound_copies_from_env("host"))

    program, w = _a_multiplying_program()
    x = torch.randn(4, 3)
    for i in range(3 * graphed.MEASURED_CALLS):
        _call_checked(program, x, w, i)
        assert program.phase == "measuring" and len(program.timed) <= graphed.MEASURED_CALLS
    assert len(program.timed) == graphed.MEASURED_CALLS and program.captures == 0
    done["gpu"] = True
    got = program.run((x, w))
    assert_bitwise(got[0], x * w, "the call after the GPU caught up")
    assert program.captures == 1 and len(program.eager_samples) == graphed.MEASURED_CALLS


def test_every_program_graphed_waits_for_its_timed_runs_and_captures(cpu_graphs, monkeypatch):
    """Where GPU-bound programs may capture (``GPU_BOUND_COPIES``: ``FUSEOPS_CUDA_GRAPHS=1`` and
    ``all``; here ``all``, ``GPU_BOUND`` infinite) the call after the timed runs waits for the last
    of them (a capture syncs anyway) and captures, however far behind the GPU is: a step's
    programs capture in one step, in order (session 49, run 12). Every call equals the eager run."""
    waits = []

    class Timed(_StandInTimed):
        def query(self):
            return False  # the GPU never caught up by itself

        def synchronize(self):
            waits.append(self)

    monkeypatch.setattr(graphed, "_Timed", Timed)

    program, w = _a_multiplying_program()
    x = torch.randn(4, 3)
    for i in range(graphed.MEASURED_CALLS + 1):
        _call_checked(program, x, w, i)
    assert program.captures == 1 and program.phase == "trial" and len(waits) == 1
    assert len(program.eager_samples) == graphed.MEASURED_CALLS


def test_a_graph_judged_after_its_inputs_moved_is_judged_against_a_fresh_measurement(cpu_graphs, monkeypatch):
    """Kept, then the input moves and the program's GPU span grows (a new cell's routing, in
    session 27's skewed MoE cells): the graph captured again is dropped against the old eager
    samples, so the program is measured afresh and captured once more, and kept; never eager
    for good over a span the eager program has too. Every call equals the eager run."""
    span = {"seconds": 1.0}

    class Timed(_StandInTimed):
        def sample(self):
            return self.host, span["seconds"], 0.0

    monkeypatch.setattr(graphed, "_Timed", Timed)
    monkeypatch.setattr(graphed, "GPU_SLACK", 1.1)

    program, w = _a_multiplying_program()
    leaves = [torch.empty(4, 3) for _ in range(3)]
    before = dict(graphed.counts)
    for i in range(24):
        if i == 8:
            assert (program.phase, program.captures) == ("graphed", 1)
            span["seconds"] = 2.0
        x = leaves[0] if i < 8 else leaves[i % 3]
        x.copy_(torch.randn(4, 3))
        _call_checked(program, x, w, i)
    delta = _delta(before)
    assert (program.phase, program.captures) == ("graphed", 3), (program.phase, program.captures, delta)
    assert delta["dropped"] == 1 and delta["stayed_eager"] == 0, str(delta)


@pytest.mark.parametrize("copies, phase", [(0.01, "graphed"), (0.5, "eager")])
def test_a_graph_is_judged_by_the_eager_span_and_its_copies(copies, phase, cpu_graphs, monkeypatch):
    """Step 3: a graph's GPU span counts as at most the eager program's plus its copies' (an event
    after them): a span 20 % over the eager one's (noise: the same kernels) keeps a graph whose
    copies take 1 % of it; copies of half of it drop the graph, the program measured and captured
    once more (a host-bound program's first such verdict), then eager for good on the second.
    Every call equals the eager run."""

    class Timed(_StandInTimed):
        copied = False

        def sample(self):
            return (self.host, 1.2, copies) if self.copied else (self.host, 1.0, 0.0)

    monkeypatch.setattr(graphed, "_Timed", Timed)
    monkeypatch.setattr(graphed, "GPU_SLACK", 1.03)

    program, w = _a_multiplying_program()
    leaves = [torch.empty(4, 3) for _ in range(2)]  # x alternates between two: a copied slot
    reason = "a graph judged slower than its eager program"
    refused_before = graphed.refusals.get(reason, 0)
    before = dict(graphed.counts)
    for i in range(24):
        x = leaves[i % 2]
        x.copy_(torch.randn(4, 3))
        _call_checked(program, x, w, i)
    captures = 1 if phase == "graphed" else 2
    assert program.captures == captures and program.phase == phase, (program.captures, program.phase)
    assert _delta(before)["dropped"] == (0 if phase == "graphed" else 2), _delta(before)
    assert graphed.refusals.get(reason, 0) - refused_before == (phase == "eager"), graphed.refusals
    assert [c for _, _, c in program.graph_samples] == [copies] * graphed.MEASURED_CALLS


@pytest.mark.parametrize("hosts, phase", [
    ((1.0, 1.0, 1.0, 0.2), "graphed"),  # the first graph trial as slow as the eager calls
    ((0.2, 0.3, 1.0, 0.5), "eager")])   # the first eager samples fast: they count again
def test_a_host_bound_graph_judged_slower_once_is_judged_again(hosts, phase, cpu_graphs, monkeypatch):
    """A host-bound program whose first graph trial sampled no less host time than its eager
    calls (samples of a model's first steps, taken among other programs' captures) is measured
    and captured once more, and judged on both trials' samples, the shortest of each: kept where
    the second trial shows the graph's host time (session 54: the MoE composition's unpermute
    backward), eager for good where the first measurement's eager samples were faster still.
    Every call equals the eager run."""
    # Host seconds by batch of samples, in the order they are read: eager, graph, eager, graph.
    batches = iter(hosts)
    batch: list[float] = []

    class Timed(_StandInTimed):
        def sample(self):
            if not batch:
                batch.extend([next(batches)] * graphed.MEASURED_CALLS)
            return batch.pop(), 0.05, 0.0

    monkeypatch.setattr(graphed, "_Timed", Timed)
    monkeypatch.setattr(graphed, "KEEP", 0.9)
    monkeypatch.setattr(graphed, "GPU_SLACK", 1.03)
    program, w = _a_multiplying_program()
    x = torch.empty(4, 3)
    before = dict(graphed.counts)
    for i in range(24):
        x.copy_(torch.randn(4, 3))
        _call_checked(program, x, w, i)
    delta = _delta(before)
    assert (program.phase, program.captures) == (phase, 2), (program.phase, program.captures, delta)
    assert delta["kept"] == (phase == "graphed") and delta["stayed_eager"] == (phase == "eager"), str(delta)


class _GpuBoundTimed(_StandInTimed):
    """A GPU span of ``span["seconds"]``, far past ``GPU_BOUND`` times any host time here."""

    span: ClassVar[dict[str, float]] = {"seconds": 1.0}

    def sample(self):
        return self.host, self.span["seconds"], 0.0


def _gpu_bound_rule(monkeypatch, mode: str = "1") -> None:
    _GpuBoundTimed.span["seconds"] = 1.0
    monkeypatch.setattr(graphed, "_Timed", _GpuBoundTimed)
    monkeypatch.setattr(graphed, "GPU_BOUND", graphed.gpu_bound_from_env(mode))
    monkeypatch.setattr(graphed, "GPU_BOUND_COPIES", graphed.gpu_bound_copies_from_env(mode))


@pytest.mark.parametrize("mode, where, phase, captures", [
    ("1", "one_address", "graphed", 1), ("1", "moving", "eager", 0), ("host", "one_address", "eager", 0)])
def test_a_gpu_bound_program_is_graphed_where_its_graph_copies_almost_nothing(
        mode, where, phase, captures, cpu_graphs, monkeypatch):
    """By default (``FUSEOPS_CUDA_GRAPHS=1``) a GPU-bound program is captured where its graph would
    copy at most ``GPU_BOUND_COPIES`` of its inputs' bytes: here where ``x`` stays put; where ``x``
    moves between two tensors the graph would copy half the bytes, and it stays eager, uncaptured,
    saying why. Under ``host`` it stays eager either way. Every call equals the eager run."""
    _gpu_bound_rule(monkeypatch, mode)
    before = dict(graphed.refusals)
    program, w = _a_multiplying_program()
    leaves = [torch.empty(4, 3) for _ in range(2)]
    for i in range(graphed.MAX_COPY_MEASUREMENTS * (graphed.MEASURED_CALLS + 1) + 4):
        x = leaves[0] if where == "one_address" else leaves[i % 2]
        x.copy_(torch.randn(4, 3))
        _call_checked(program, x, w, i)
    assert (program.phase, program.captures) == (phase, captures), (program.phase, program.captures)
    refused = graphed.refusals.get("a GPU-bound program whose graph would copy its inputs", 0)
    assert refused - before.get("a GPU-bound program whose graph would copy its inputs", 0) == (
        where == "moving" and mode == "1")


@pytest.mark.parametrize("move", ["activation", "parameter"])
def test_a_gpu_bound_graph_whose_input_moves_leaves_its_program_eager(move, cpu_graphs, monkeypatch):
    """Graphed while its inputs stayed put; then ``x`` moves between two tensors (captured again
    with ``x`` copied: too much), or the parameter is given new storage each call (FSDP-style
    gathering; not captured again): the program stays eager for good (no measuring again), and
    every call equals the eager run."""
    _gpu_bound_rule(monkeypatch)
    program, _ = _a_multiplying_program()
    w = torch.nn.Parameter(torch.randn(4, 3))
    leaves = [torch.empty(4, 3) for _ in range(3)]
    before = dict(graphed.counts)
    with torch.no_grad():
        for i in range(24):
            if i == 8:
                assert (program.phase, program.captures) == ("graphed", 1)
            if i >= 8 and move == "parameter":
                w.data = torch.randn(4, 3)
            x = leaves[0] if i < 8 or move == "parameter" else leaves[1 + i % 2]
            x.copy_(torch.randn(4, 3))
            _call_checked(program, x, w, i)
    delta = _delta(before)
    assert (program.phase, program.captures) == ("eager", 1), (program.phase, program.captures, delta)
    assert delta["stayed_eager"] == 1 and delta["captured"] == 1, str(delta)
    assert delta["recaptured"] == (move == "activation"), str(delta)


def test_a_gpu_bound_graph_whose_result_outlives_its_next_call_leaves_its_program_eager(cpu_graphs, monkeypatch):
    """Graphed; a replay's result is then held over the next call (a micro-batch's activations):
    its results would go out as copies from then on, GPU work a GPU-bound graph must not add, so
    the program stays eager for good. The held result keeps its values; every call equals the
    eager run."""
    _gpu_bound_rule(monkeypatch)
    program, w = _a_multiplying_program()
    x = torch.empty(4, 3)
    before = dict(graphed.counts)
    for i in range(16):
        if i == 8:
            assert (program.phase, program.captures) == ("graphed", 1)
        x.copy_(torch.randn(4, 3))
        got = program.run((x, w))
        assert_bitwise(got[0], x * w, f"call {i}")
        if i == 8:
            held, want = got[0], got[0].clone()
        del got
    assert_bitwise(held, want, "the held result")
    delta = _delta(before)
    assert (program.phase, program.captures) == ("eager", 1), (program.phase, program.captures, delta)
    assert delta["busy"] == 1 and delta["stayed_eager"] == 1 and delta["copied_out"] == 0, str(delta)


def test_a_gpu_bound_graph_dropped_leaves_its_program_eager(cpu_graphs, monkeypatch):
    """A consumer on trial finds its input moved into its producer's graph (graphed a step
    later): captured again there (pinned: no copy), judged against its eager samples from before
    by its own span, which has doubled, and dropped: a GPU-bound program then stays eager for
    good, where a host-bound one is measured afresh (``test_a_graph_judged_after_its_inputs_moved...``).
    The producer's graph is kept (its span counts as at most the eager one's). Every call
    equals the eager run."""
    _gpu_bound_rule(monkeypatch)
    monkeypatch.setattr(graphed, "GPU_SLACK", 1.1)
    producer, w = _a_multiplying_program()
    consumer = graphed.GraphedProgram(_times, None, torch.device("cpu"))
    w2 = torch.randn(4, 3)
    x, y_before = torch.empty(4, 3), torch.empty(4, 3)
    before = dict(graphed.counts)
    reason = "a graph judged slower than its program measured before its inputs moved (GPU-bound)"
    refused_before = graphed.refusals.get(reason, 0)
    for i in range(20):
        x.copy_(torch.randn(4, 3))
        if i == graphed.MEASURED_CALLS + 2:
            assert (consumer.phase, consumer.captures) == ("trial", 1)
            assert (producer.phase, producer.captures) == ("trial", 1)
            _GpuBoundTimed.span["seconds"] = 2.0
        if i >= 1:  # the producer starts a call later
            y = producer.run((x, w))[0]
            assert_bitwise(y, x * w, f"producer call {i}")
        if i < graphed.MEASURED_CALLS + 2:  # until the producer's graph hands out its result
            torch.mul(x, w, out=y_before)
            y = y_before
        z = consumer.run((y, w2))[0]
        assert_bitwise(z, x * w * w2, f"consumer call {i}")
        del y, z
    delta = _delta(before)
    assert (consumer.phase, consumer.captures) == ("eager", 2), (consumer.phase, consumer.captures, delta)
    assert (producer.phase, producer.captures) == ("graphed", 1), (producer.phase, producer.captures, delta)
    assert delta["dropped"] == 1 and delta["stayed_eager"] == 1 and delta["recaptured"] == 1, str(delta)
    assert graphed.refusals.get(reason, 0) - refused_before == 1, graphed.refusals


# (Not "gpu": a test id holding the gpu marker's name is taken for a GPU test.)
@pytest.mark.parametrize("bound, where", [("host_bound", "moving"), ("gpu_bound", "moving"),
                                          ("gpu_bound", "one_address")])
def test_a_graph_whose_input_left_other_graphs_memory_is_measured_afresh(bound, where, cpu_graphs, monkeypatch):
    """A consumer graphed over its producer's graphed result (pinned there) finds its input at
    another address out of graph memory for ``MEASURED_CALLS`` calls (its producer runs eagerly
    now): the graph is dropped and the program measured afresh, GPU-bound or not (the producer's
    doing, not the consumer's; session 54: the MoE composition's experts' backward went eager for
    good after the unpermute backward before it was dropped). Captured again: a host-bound one with
    the input copied; a GPU-bound one where the producer's eager results lie at one address (pinned
    there), not where they move between two (its graph would copy half its bytes: eager, saying
    why). Every call equals the eager run."""
    if bound == "gpu_bound":
        _gpu_bound_rule(monkeypatch)
    producer, w = _a_multiplying_program()
    consumer = graphed.GraphedProgram(_times, None, torch.device("cpu"))
    w2 = torch.randn(4, 3)
    x = torch.empty(4, 3)
    elsewhere = [torch.empty(4, 3) for _ in range(2)]  # the producer's eager results
    before, refusals_before = dict(graphed.counts), dict(graphed.refusals)
    turn, captured = 12, None
    for i in range(turn + (graphed.MAX_COPY_MEASUREMENTS + 2) * (graphed.MEASURED_CALLS + 1) + 4):
        x.copy_(torch.randn(4, 3))
        if i < turn:
            y = producer.run((x, w))[0]
        else:
            if i == turn:
                assert (producer.phase, consumer.phase) == ("graphed", "graphed"), (producer.phase, consumer.phase)
                captured = consumer.captures
            y = torch.mul(x, w, out=elsewhere[i % 2 if where == "moving" else 0])
        assert_bitwise(y, x * w, f"producer call {i}")
        z = consumer.run((y, w2))[0]
        assert_bitwise(z, x * w * w2, f"consumer call {i}")
        del y, z
    delta = _delta(before)
    refused = changed_since(refusals_before, graphed.refusals)
    assert delta["dropped"] == 1, str(delta)
    if bound == "gpu_bound" and where == "moving":
        assert (consumer.phase, consumer.captures) == ("eager", captured), (consumer.phase, consumer.captures, delta)
        assert refused == {"a GPU-bound program whose graph would copy its inputs": 1}, refused
    else:
        assert (consumer.phase, consumer.captures) == ("graphed", captured + 1), (consumer.phase, consumer.captures)
        assert refused == {}, refused
        assert not consumer.buffers if bound == "gpu_bound" else consumer.buffers, consumer.buffers


def test_a_gpu_bound_program_whose_input_settles_in_a_graph_is_captured_later(cpu_graphs, monkeypatch):
    """A GPU-bound consumer measured while its input moves (its producer still measuring and on
    trial, its results where the allocator puts them) would copy half its bytes: measured again,
    uncaptured, and captured once the input lies in the producer's graph, pinned there (session
    54: the MoE composition's experts' backward after the unpermute backward). Every call equals
    the eager run."""
    _gpu_bound_rule(monkeypatch)
    producer, w = _a_multiplying_program()
    consumer = graphed.GraphedProgram(_times, None, torch.device("cpu"))
    w2 = torch.randn(4, 3)
    x = torch.empty(4, 3)
    elsewhere = [torch.empty(4, 3) for _ in range(2)]
    settled = graphed.MEASURED_CALLS + 4  # the producer's graph hands out its results from here on
    before, refusals_before = dict(graphed.counts), dict(graphed.refusals)
    for i in range(settled + 3 * (graphed.MEASURED_CALLS + 1) + 4):
        x.copy_(torch.randn(4, 3))
        y = producer.run((x, w))[0]
        if i < settled:
            y = torch.mul(x, w, out=elsewhere[i % 2])
        assert_bitwise(y, x * w, f"producer call {i}")
        z = consumer.run((y, w2))[0]
        assert_bitwise(z, x * w * w2, f"consumer call {i}")
        del y, z
    assert (producer.phase, producer.captures) == ("graphed", 1), (producer.phase, producer.captures)
    assert (consumer.phase, consumer.captures) == ("graphed", 1), (consumer.phase, consumer.captures)
    assert consumer.copy_measurements == 1 and not consumer.buffers, (consumer.copy_measurements, consumer.buffers)
    assert changed_since(refusals_before, graphed.refusals) == {}, graphed.refusals
    assert _delta(before)["stayed_eager"] == 0, _delta(before)


@pytest.mark.parametrize("autocast", [False, True])
def test_gpu_bound_programs_copying_the_weight_casts_stay_eager(autocast, cpu_graphs, monkeypatch):
    """A training loop of GPU-bound programs whose input stays put, float32 weights: without
    autocast its programs are graphed; under bf16 autocast a graph would copy the weight cache's
    casts in after every optimizer step (inputs to it too), far past ``GPU_BOUND_COPIES``, so
    every program taking casts stays eager, uncaptured. Every call equals the full path."""
    _gpu_bound_rule(monkeypatch)
    torch.manual_seed(0)
    model = blocks(2)
    x = torch.randn(8, H)

    def one_step(m, i):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = m(x).float().square().mean()
            loss.backward()
        return [loss.detach(), *[p.grad.clone() for p in m.parameters()]]

    steps, _ = training_loop(one_step)
    _same_as_full_path(model, steps, monkeypatch)
    states = graph_states(model)
    with_casts = [g for g in states if g.derived_count]
    assert bool(with_casts) == autocast
    assert all((g.phase, g.captures) == ("eager", 0) for g in with_casts), [(g.phase, g.captures) for g in states]
    assert autocast or any(g.phase == "graphed" for g in states), [(g.phase, g.captures) for g in states]


def test_a_held_result_sends_the_next_call_the_eager_way(cpu_graphs, monkeypatch):
    """A result of the last replay that is still alive is never overwritten: that call runs
    eagerly (``busy``) and the held result keeps its values. Results found alive go out as
    copies from then on, and after ``MEASURED_CALLS`` busy calls in a row the program is
    captured again, into memory of its own: the graph replays again."""
    torch.manual_seed(0)
    model = blocks(1)
    calls = [_inputs("residual_branch", torch.device("cpu"), seed)[0] for seed in range(14)]

    def steps(m):
        held = []
        with torch.no_grad():
            for x in calls:
                held.append(m(x))
        return [[t] for t in held]

    delta = _same_as_full_path(model, steps, monkeypatch)
    assert delta["busy"] >= 1 and delta["recaptured"] >= 1 and delta["copied_out"] >= 1, str(delta)
    assert delta["graph_replays"] >= 4, str(delta)


def keeping_its_output(x):
    """A user's ``one_step`` (``training_loop``): ``out = m(x)`` stays bound until the next step
    reassigns it; returns the output and the parameters' gradients."""
    kept = {}

    def one_step(m, i):
        kept["out"] = m(x)  # bound until the next step's
        kept["out"].square().mean().backward()
        return [kept["out"].detach().clone(), *[p.grad.clone() for p in m.parameters()]]
    return one_step


def test_a_user_loop_that_keeps_its_output_replays_every_program(cpu_graphs, monkeypatch):
    """``out = model(x)`` stays bound until the next step reassigns it, an optimizer steps:
    the last block's output is found alive once, goes out as a copy from then on, and every
    program replays its graph in the last steps; every step equals the full path."""
    torch.manual_seed(0)
    model = blocks(3)
    one_step = keeping_its_output(torch.randn(8, H))
    steps, tail = training_loop(one_step)
    delta = _same_as_full_path(model, steps, monkeypatch)
    assert delta["copied_out"] >= 1, str(delta)
    assert tail["last"]["graph_replays"] == 5 * 6 and tail["last"]["busy"] == 0, str(tail["last"])


def test_gradients_kept_by_zero_grad_replay_every_program(cpu_graphs, monkeypatch):
    """After steps that set the gradients to None (autograd then keeps the backward graph's own
    results as ``.grad``), ``zero_grad(set_to_none=False)`` keeps them and zeroes them in place:
    found alive, they go out as copies from then on, and every program replays in the last
    steps; every step equals the full path."""
    torch.manual_seed(0)
    model = blocks(1)
    x = torch.randn(8, H)

    def one_step(m, i):
        m(x).square().mean().backward()
        return [p.grad.clone() for p in m.parameters()]

    steps, tail = training_loop(one_step, set_to_none=lambda i: i < 15)
    delta = _same_as_full_path(model, steps, monkeypatch)
    assert delta["copied_out"] >= 1, str(delta)
    assert tail["last"]["graph_replays"] == 5 * 2 and tail["last"]["busy"] == 0, str(tail["last"])


def test_float32_weights_under_autocast_with_an_eval_step_between(cpu_graphs, monkeypatch):
    """A user's mixed-precision loop: float32 weights under bf16 autocast (the weight cache's
    casts enter the graphs as inputs, copied in when the optimizer changed the weights), and a
    no-grad eval call of the same model between training steps (its own programs): every call
    equals the full path, and every training program replays in the last steps."""
    torch.manual_seed(0)
    model = blocks(2)
    x = torch.randn(8, H)

    def one_step(m, i):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(x).float().square().mean()
            loss.backward()
            with torch.no_grad():
                evaluated = m(x)
        return [loss.detach(), evaluated.clone(), *[p.grad.clone() for p in m.parameters()]]

    steps, tail = training_loop(one_step)
    _same_as_full_path(model, steps, monkeypatch)
    # Per step: 2 forwards, 2 backwards and 2 no-grad forwards, all graphed.
    assert tail["last"]["graph_replays"] == 5 * 6 and tail["last"]["busy"] == 0, str(tail["last"])
    assert any(g.derived_count for g in graph_states(model)), "no program took the weight cache's casts"


@pytest.mark.parametrize("change", ["optimizer_step", "data_replaced"])
def test_graphs_follow_the_parameters(change, cpu_graphs, monkeypatch):
    """An optimizer's in-place step reaches the next replay (parameters are read where they
    lie); a parameter given new storage (``param.data = ...``) makes the program capture again
    at once, with the parameter pinned at its new address, never copied into the graph."""
    torch.manual_seed(0)
    model = MODELS["dense_gelu"]()
    calls = [_inputs("dense_gelu", torch.device("cpu"), seed) for seed in range(24)]

    def steps(m):
        seen = []
        for i, inputs in enumerate(calls):
            change_parameters(m, i, change, replace_at=12)
            seen.append([None if t is None else t.clone() for t in _step(m, inputs)])
        return seen

    delta = _same_as_full_path(model, steps, monkeypatch)
    assert delta["dropped"] == 0 and delta["graph_replays"] >= 16, str(delta)
    if change == "data_replaced":
        assert delta["recaptured"] >= 2, str(delta)
    for state in graph_states(model):
        assert not state.param_slots & set(state.buffers), "a parameter is copied into its graph"


def test_two_input_shapes_in_turn_each_get_their_graphs(cpu_graphs, monkeypatch):
    """A model called with two row counts in turn (as a last, shorter batch does): each layout
    has its own programs and graphs, and every call equals the full path."""
    torch.manual_seed(0)
    model = MODELS["dense_swiglu_layernorm"]()
    calls = []
    for seed in range(28):
        inputs = _inputs("dense_swiglu_layernorm", torch.device("cpu"), seed)
        calls.append([t[: 3 + 5 * (seed % 2)] for t in inputs])  # 3 and 8 rows in turn
    delta = _same_as_full_path(model, _steps(calls), monkeypatch)
    assert delta["kept"] >= 4 and delta["dropped"] == 0 and delta["graph_replays"] >= 4 * 6, str(delta)


@pytest.mark.parametrize("held", [False, True])
def test_idle_graphs_past_the_budget_are_freed_oldest_first(held, cpu_graphs, monkeypatch):
    """Three programs graphed in turn (as a model's through three token counts), each idle once
    the next is called: where the idle graphs hold more than the budget (here one graph's
    results), a capture frees the oldest, whose program is measured and graphed again when
    called again. A graph whose result is alive is never freed. Every call equals the eager run."""
    monkeypatch.setattr(graphed, "idle_calls", lambda: 2)
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    xs = [torch.randn(4, 3) for _ in range(3)]  # each at one address: pinned
    programs = [graphed.GraphedProgram(lambda x: (x * w,), None, torch.device("cpu")) for _ in xs]
    monkeypatch.setattr(graphed, "budget", lambda device: xs[0].nbytes)
    kept = []

    def call(k: int, times: int = 8) -> None:
        for i in range(times):
            got = programs[k].run((xs[k],))
            assert_bitwise(got[0], xs[k] * w, f"program {k} call {i}")
            if held and k == 0 and i == times - 1:
                kept.append(got)  # its last result, alive
            del got  # a live result of the last replay would send the next call the eager way

    before = dict(graphed.counts)
    call(0)
    call(1)
    assert [p.phase for p in programs[:2]] == ["graphed", "graphed"], "one idle graph is within the budget"
    call(2)
    if held:
        assert [p.phase for p in programs] == ["graphed"] * 3 and _delta(before)["evicted"] == 0
        return
    assert (programs[0].phase, programs[0].graph) == ("measuring", None), "the oldest idle graph was kept"
    assert [p.phase for p in programs[1:]] == ["graphed", "graphed"] and _delta(before)["evicted"] == 1
    call(0)
    assert (programs[0].phase, programs[0].captures) == ("graphed", 2)
    assert programs[1].phase == "measuring" and _delta(before)["evicted"] == 2


def test_free_releases_every_graph_not_in_use(cpu_graphs, monkeypatch):
    """``graphed.free()`` frees the graphs whose results are gone, not one whose result lives;
    the freed programs are measured and graphed again at their next calls, equal to the eager run."""
    torch.manual_seed(0)
    w = torch.randn(4, 3)
    xs = [torch.randn(4, 3) for _ in range(2)]
    programs = [graphed.GraphedProgram(lambda x: (x * w,), None, torch.device("cpu")) for _ in xs]

    def call(k: int, times: int = 8) -> tuple:
        for i in range(times):
            got = programs[k].run((xs[k],))
            assert_bitwise(got[0], xs[k] * w, f"program {k} call {i}")
            if i < times - 1:
                del got  # a live result of the last replay would send the next call the eager way
        return got  # the last result, over graph memory, alive while the caller holds it

    call(0)
    held = call(1)
    assert graphed.free("cuda") == 0, "a CPU program's graph freed for another device"
    assert graphed.free("cpu") == 1
    assert [(p.phase, p.graph is None) for p in programs] == [("measuring", True), ("graphed", False)]
    assert_bitwise(held[0], xs[1] * w, "the live result")
    del held
    call(0)
    assert (programs[0].phase, programs[0].captures) == ("graphed", 2)


def test_a_model_through_two_row_counts_frees_the_idle_ones_graphs(cpu_graphs, monkeypatch):
    """A model through 8 rows, then 16, then 8 again, with no memory for idle graphs: each row
    count's captures free the other's graphs once idle, every call equals the full path, and the
    row count called last is graphed again."""
    monkeypatch.setattr(graphed, "idle_calls", lambda: 8)  # two steps of two blocks' programs
    monkeypatch.setattr(graphed, "budget", lambda device: 0)
    torch.manual_seed(0)
    model = blocks(2)
    calls = [[torch.randn(rows, H)] for rows in [8] * 10 + [16] * 10 + [8] * 14]
    delta = _same_as_full_path(model, _steps(calls), monkeypatch)
    assert delta["evicted"] >= 8, str(delta)
    # Each block's forward and backward at 8 rows graphed again; at 16 rows freed. (Captures
    # counted at least: the CPU allocator may move an input once, as earlier tests left it.)
    states = graph_states(model)
    assert sorted(g.phase for g in states) == ["graphed"] * 4 + ["measuring"] * 4, [g.phase for g in states]
    assert all(g.captures >= 2 for g in states if g.phase == "graphed"), [g.captures for g in states]


def test_a_block_applied_to_its_own_output_equals_the_full_path(cpu_graphs, monkeypatch):
    """One block twice a step, the second call on the first's output (shared weights, one
    program for both calls): the second call finds the first's results alive, which then go out
    as copies; every call equals the full path."""
    torch.manual_seed(0)
    block = blocks(1)
    calls = [_inputs("residual_branch", torch.device("cpu"), seed)[0] for seed in range(20)]

    def steps(m):
        out = []
        for x in calls:
            for p in m.parameters():
                p.grad = None
            x = x.clone().requires_grad_()
            y = m(m(x))
            y.square().sum().backward()
            out.append([y.detach().clone(), x.grad.clone(), *[p.grad.clone() for p in m.parameters()]])
            del y
        return out

    delta = _same_as_full_path(block, steps, monkeypatch)
    assert delta["graph_replays"] >= 10 and delta["copied_out"] >= 1, str(delta)


def programs_in(layouts: replay.Layouts | None) -> list:
    """The recorded programs of one ``Prepared`` run's ``layouts``, forward and backward."""
    found = []
    for table in (layouts.forward, layouts.backward) if layouts is not None else ():
        found += [p for p in (table or {}).values() if isinstance(p, replay.Program)]
    return found


def recorded_programs(model) -> list:
    """The recorded programs of ``model``'s Sequentials, forward and backward."""
    return [p for m in model.modules() if isinstance(m, fuseops.Sequential)
            for prepared in m._calls._runs.values() for p in programs_in(prepared.layouts)]


def graph_states(model) -> list:
    """The graph states of ``model``'s recorded programs."""
    return [p.graph for p in recorded_programs(model) if p.graph is not None]
