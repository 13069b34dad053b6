"""The graph states of recorded programs (``fuseops/ops/executor/graphed.py``) on the CPU: measuring,
capturing, on trial, graphed, captured again after an input moved, busy while a result lives. A
stand-in for CUDA graphs keeps their semantics that the states rely on: capturing runs the body once
before and once in the capture, and the captured results stay where they are, overwritten by each
replay (here: the body runs again and its results are copied into them). So the CPU suite checks the
state machine bit for bit against the full path; the GPU tests (test_graphed.py) check real graphs."""

from __future__ import annotations

import copy
import gc
import time
import weakref

import pytest
import torch

import fuseops
from fuseops import ops
from fuseops.ops.executor import graph_pool, graphed, replay
from tests.helpers import assert_bitwise
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

    def sample(self) -> tuple[float, float]:
        return self.host, self.host


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
    monkeypatch.setattr(graphed, "_graph_memory", set())
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


def test_a_host_ahead_of_the_gpu_times_only_the_measured_calls(cpu_graphs, monkeypatch):
    """While the timed runs are not complete (the GPU behind the host), later calls run untimed:
    no more than ``MEASURED_CALLS`` are held, so a host running far ahead piles up no events and
    the verdict rests on the first calls' samples. Every call equals the eager run."""
    done = {"gpu": False}

    class Timed(_StandInTimed):
        def query(self):
            return done["gpu"]

    monkeypatch.setattr(graphed, "_Timed", Timed)

    def run(x, w):
        return (x * w,)

    torch.manual_seed(0)
    w, x = torch.randn(4, 3), torch.randn(4, 3)
    program = graphed.GraphedProgram(run, None, torch.device("cpu"))
    for i in range(3 * graphed.MEASURED_CALLS):
        got = program.run((x, w))
        assert_bitwise(got[0], x * w, f"call {i}")
        assert program.phase == "measuring" and len(program.timed) <= graphed.MEASURED_CALLS
        del got
    assert len(program.timed) == graphed.MEASURED_CALLS and program.captures == 0
    done["gpu"] = True
    got = program.run((x, w))
    assert_bitwise(got[0], x * w, "the call after the GPU caught up")
    assert program.captures == 1 and len(program.eager_samples) == graphed.MEASURED_CALLS


def test_a_graph_judged_after_its_inputs_moved_is_judged_against_a_fresh_measurement(cpu_graphs, monkeypatch):
    """Kept, then the input moves and the program's GPU span grows (a new cell's routing, in
    session 27's skewed MoE cells): the graph captured again is dropped against the old eager
    samples, so the program is measured afresh and captured once more, and kept; never eager
    for good over a span the eager program has too. Every call equals the eager run."""
    span = {"seconds": 1.0}

    class Timed(_StandInTimed):
        def sample(self):
            return self.host, span["seconds"]

    monkeypatch.setattr(graphed, "_Timed", Timed)
    monkeypatch.setattr(graphed, "GPU_SLACK", 1.1)

    def run(x, w):
        return (x * w,)

    torch.manual_seed(0)
    w = torch.randn(4, 3)
    leaves = [torch.empty(4, 3) for _ in range(3)]
    program = graphed.GraphedProgram(run, None, torch.device("cpu"))
    before = dict(graphed.counts)
    for i in range(24):
        if i == 8:
            assert (program.phase, program.captures) == ("graphed", 1)
            span["seconds"] = 2.0
        x = leaves[0] if i < 8 else leaves[i % 3]
        x.copy_(torch.randn(4, 3))
        got = program.run((x, w))
        assert_bitwise(got[0], x * w, f"call {i}")
        del got  # a live result of the last replay would send the next call the eager way
    delta = _delta(before)
    assert (program.phase, program.captures) == ("graphed", 3), (program.phase, program.captures, delta)
    assert delta["dropped"] == 1 and delta["stayed_eager"] == 0, str(delta)


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


def recorded_programs(model) -> list:
    """The recorded programs of ``model``'s Sequentials, forward and backward."""
    found = []
    for m in model.modules():
        if isinstance(m, fuseops.Sequential):
            for prepared in m._calls._runs.values():
                layouts = prepared.layouts
                for table in (layouts.forward, layouts.backward) if layouts is not None else ():
                    found += [p for p in (table or {}).values() if isinstance(p, replay.Program)]
    return found


def graph_states(model) -> list:
    """The graph states of ``model``'s recorded programs."""
    return [p.graph for p in recorded_programs(model) if p.graph is not None]


class _PoolThatClobbers:
    """Stand-in captures into one shared pool (``graph_pool.py``) whose every write set is all
    the memory free at its capture: a replay writes (NaN) over the results of every graph
    captured after it, which the allocator could have placed there, that graph freed or not (a
    result handed out keeps its memory)."""

    def __init__(self) -> None:
        # Each capture's results in graph memory, in capture order (held: a freed graph's
        # result handed out reads that memory).
        self.order: list[list[torch.Tensor]] = []

    def capture(self, body, static, device, after_warm_up, pool):
        graph, results, writes = _stand_in_capture(body, static, device, after_warm_up, pool)
        if pool is None:  # a private pool: no other graph's memory
            return graph, results, writes
        position = len(self.order)
        self.order.append([t for t in graph.results if t is not None])
        replay = graph.replay

        def replay_over_later_results():
            replay()
            for later in self.order[position + 1:]:
                for t in later:
                    t.fill_(float("nan"))
        graph.replay = replay_over_later_results
        return graph, results, ((0, 2**64),)


def _a_feeding_b():
    """Two programs on the stand-ins: A (``x * 2 + 1``), and B (its sine) taking A's result."""
    return (graphed.GraphedProgram(lambda x: (x * 2 + 1,), None, torch.device("cpu")),
            graphed.GraphedProgram(lambda y: (y.sin(),), None, torch.device("cpu")))


@pytest.mark.parametrize("rule", ["on", "off"])
def test_a_graph_never_replays_over_a_later_graphs_live_result(rule, cpu_graphs, monkeypatch):
    """Two programs, A feeding B, graphed in one shared pool, B captured after A into memory A's
    replays write. While the caller keeps B's result past the next call of A, A runs eagerly
    (``clobbered``) and the kept result stays as it was; B, finding its result alive at its own
    call, hands it out as a copy from then on, so A replays again. With the rule off (control),
    A's replay overwrites the kept result: the stand-in does what a shared pool would."""
    monkeypatch.setattr(graphed, "capture", _PoolThatClobbers().capture)
    if rule == "off":
        monkeypatch.setattr(graph_pool, "clobbered", lambda clobbers: False)

    a, b = _a_feeding_b()
    x = torch.empty(4, 3)
    torch.manual_seed(0)
    values = [torch.randn(4, 3) for _ in range(14)]
    before = dict(graphed.counts)
    kept = want_kept = None
    for i, v in enumerate(values):
        x.copy_(v)
        (ya,) = a.run((x,))
        if kept is not None:
            # Read before B's call: B's own replay would rewrite its kept result with this call's.
            intact = torch.equal(kept, want_kept)
            if rule == "off":
                assert not intact, "the stand-in's replay of A did not write over B's kept result"
                return
            assert intact, f"call {i}: B's result kept from the last call was overwritten"
        (yb,) = b.run((ya,))
        assert_bitwise(ya, v * 2 + 1, f"call {i}: A's result")
        assert_bitwise(yb, (v * 2 + 1).sin(), f"call {i}: B's result")
        del ya
        # From call 10 on (both graphed), the caller keeps B's result until the next call.
        kept, want_kept = (yb, yb.clone()) if i >= 10 else (None, None)
        del yb
    delta = _delta(before)
    assert a.phase == "graphed" and b.phase in ("graphed", "trial"), (a.phase, b.phase)
    assert a.clobbers, "B's results are not noted in A's write set"
    assert delta["clobbered"] == 1 and delta["copied_out"] == 1, str(delta)


def test_the_shared_pool_notes_later_results_in_earlier_write_sets():
    """``SharedPool.admit``: a newcomer's result in an earlier member's write set is noted there
    (and only there); ``clobbered`` sees it alive while a tensor beyond the holder's shares its
    storage, and after its graph was captured again while any tensor over it lives (dropped
    from the earlier member's ``clobbers`` once gone)."""
    class Member:
        def __init__(self, writes, results):
            self.writes, self.clobbers, self.capture_id = writes, [], 1
            self.storages = [r.untyped_storage() for r in results]

        def settle(self):  # the use counts with only this object holding its results
            self.alone = [(s._cdata, torch._C._storage_Use_Count(s._cdata)) for s in self.storages]
            return self

    pool = graph_pool.SharedPool(torch.device("cpu"))
    r = torch.zeros(16)
    start = r.untyped_storage().data_ptr()
    inside = Member(((start - 64, start + 8),), [torch.zeros(1)]).settle()
    outside = Member(((start + 64, start + 128),), [torch.zeros(1)]).settle()
    pool.admit(inside)
    pool.admit(outside)
    newcomer = Member((), [r]).settle()
    pool.admit(newcomer)
    assert len(inside.clobbers) == 1 and outside.clobbers == [] and newcomer.clobbers == []
    alive = r.view(4, 4)
    assert graph_pool.clobbered(inside.clobbers)
    del alive
    newcomer.settle()
    assert not graph_pool.clobbered(inside.clobbers)
    alive = r.view(4, 4)
    newcomer.capture_id = 2  # captured again: its old result is no longer its graph's, but lives
    assert graph_pool.clobbered(inside.clobbers)
    del alive, r
    newcomer.storages = []
    assert not graph_pool.clobbered(inside.clobbers) and inside.clobbers[0].gone()
    later = Member((), []).settle()
    pool.admit(later)
    assert inside.clobbers == [], "a result gone for good is still noted"
    pool.leave(later)
    pool.leave(inside)
    pool.leave(outside)
    assert pool.members and pool._handle is None
    pool.leave(newcomer)
    assert not pool.members


def test_write_sets_merge_and_overlap():
    trace = [{"action": "alloc", "addr": 100, "size": 50, "stream": 7},
             {"action": "alloc", "addr": 140, "size": 20, "stream": 7},
             {"action": "free_requested", "addr": 300, "size": 10, "stream": 7},
             {"action": "alloc", "addr": 400, "size": 10, "stream": 8},
             {"action": "alloc", "addr": 200, "size": 10, "stream": 7}]
    ranges = graph_pool.write_set(trace, 7)
    assert ranges == ((100, 160), (200, 210))
    assert graph_pool.overlaps(ranges, 150, 170) and graph_pool.overlaps(ranges, 205, 206)
    assert not graph_pool.overlaps(ranges, 160, 200) and not graph_pool.overlaps(ranges, 0, 100)
    assert not graph_pool.overlaps(ranges, 400, 410) and not graph_pool.overlaps((), 0, 10)


@pytest.mark.parametrize("raises", [False, True])
def test_a_capture_records_the_allocator_history_alone_and_turns_it_off(raises, monkeypatch):
    """``graph_pool.allocations`` (the allocator's calls stood in for): the history is turned on
    with a cleared trace, read for the capturing stream's allocations, and turned off, also when
    the capture raises; one recording at a time (the lock is free again after)."""
    calls = []
    trace = [{"action": "alloc", "addr": 64, "size": 32, "stream": 5},
             {"action": "alloc", "addr": 512, "size": 8, "stream": 6}]
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled, **kw: calls.append((enabled, kw.get("clear_history"))))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda device: {"device_traces": [[], trace]})

    class Stream:
        cuda_stream = 5

    def capture():
        with graph_pool.allocations(torch.device("cuda", 1), Stream()) as found:
            assert graph_pool._recording.locked(), "recorded without the lock"
            if raises:
                raise RuntimeError("capture failed")
        return found

    if raises:
        with pytest.raises(RuntimeError, match="capture failed"):
            capture()
    else:
        assert capture().ranges == ((64, 96),)
    assert calls == [("all", True), (None, None)], calls
    assert not graph_pool._recording.locked()


def _a_kept_output_loop(pool, set_to_none, monkeypatch):
    """A 4-block stack's training loop on ``pool``'s stand-in captures, its output kept until the
    next step, gradients set to None (or, with ``set_to_none`` False, zeroed from step 15 on):
    equal to the full path bit for bit. Returns the counts' change and the last steps' counts."""
    monkeypatch.setattr(graphed, "capture", pool.capture)
    torch.manual_seed(0)
    model = blocks(4)
    one_step = keeping_its_output(torch.randn(8, H))
    steps, tail = training_loop(one_step, set_to_none=lambda i: set_to_none or i < 15)
    return _same_as_full_path(model, steps, monkeypatch), tail


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_training_loop_under_worst_case_write_sets_equals_the_full_path(set_to_none, cpu_graphs, monkeypatch):
    """Every graph's replay writing over the results of every graph captured after it (the
    largest write sets a shared pool could give): a 4-block stack whose output the loop keeps
    until the next step, gradients set to None or kept and zeroed by ``zero_grad``. Every step
    equals the full path bit for bit, and every program replays in the last steps. (The MoE
    routing's states under such write sets also equal their calls without graphs, but churn:
    captured again and again, some still on trial at the end; a real pool's write sets are its
    captures' own allocations.)"""
    delta, tail = _a_kept_output_loop(_PoolThatClobbers(), set_to_none, monkeypatch)
    # The rule was met (the kept output lies in every earlier graph's write set here) and settled.
    assert delta["clobbered"] >= 1, str(delta)
    assert tail["last"]["graph_replays"] == 5 * 8 and tail["last"]["clobbered"] == 0, str(tail["last"])


def test_a_program_captured_around_live_results_twice_goes_to_a_private_pool(cpu_graphs, monkeypatch):
    """After ``SHARED_CAPTURES`` captures again around a later graph's live result, a program's
    next capture gets a private pool (no write set, no clobbers): two programs capturing into
    each other's write sets stop there, not at ``MAX_CAPTURES``."""
    pools = []

    def capture(body, static, device, after_warm_up, pool):
        pools.append(pool)
        return _stand_in_capture(body, static, device, after_warm_up, pool)
    monkeypatch.setattr(graphed, "capture", capture)
    program = graphed.GraphedProgram(lambda t: (t * 2,), None, torch.device("cpu"))
    x = torch.randn(4, 3)
    for _ in range(8):
        assert_bitwise(program.run((x,))[0], x * 2, "the result")
    assert program.phase == "graphed" and program.pool is not None and pools[-1] is not None
    program.clobber_captures = graphed.SHARED_CAPTURES
    assert_bitwise(program._capture_again((x,), program._pinned_slots())[0], x * 2, "the result")
    assert pools[-1] is None and program.pool is None and program.writes == () and program.clobbers == []
    for _ in range(4):
        assert_bitwise(program.run((x,))[0], x * 2, "the result")
    assert program.phase == "graphed", program.phase


def test_a_later_graphs_result_kept_past_its_graph_is_never_overwritten(cpu_graphs, monkeypatch):
    """B's result lies in A's write set (the stand-in pool); the caller keeps one past B's
    graph, which is captured again meanwhile (its old result is no longer its graph's but still
    lives in that memory). A runs eagerly while it lives, replays once it is gone."""
    monkeypatch.setattr(graphed, "capture", _PoolThatClobbers().capture)

    a, b = _a_feeding_b()
    x = torch.empty(4, 3)
    torch.manual_seed(0)
    values = torch.randn(12, 4, 3)
    for v in values[:8]:  # both graphed
        x.copy_(v)
        (ya,) = a.run((x,))
        assert_bitwise(b.run((ya,))[0], (v * 2 + 1).sin(), "B's result")
        del ya
    assert a.phase == b.phase == "graphed" and a.clobbers, (a.phase, b.phase, a.clobbers)
    x.copy_(values[8])
    (ya,) = a.run((x,))
    (kept,) = b.run((ya,))
    want = kept.clone()
    b._capture_again((ya,), b._pinned_slots())
    del ya
    before = dict(graphed.counts)
    for v in values[9:]:
        x.copy_(v)
        (ya,) = a.run((x,))
        assert_bitwise(ya, v * 2 + 1, "A's result")
        del ya
        assert_bitwise(kept, want, "B's result kept past its graph")
    assert _delta(before)["clobbered"] == 3, str(_delta(before))
    del kept
    x.copy_(values[0])
    replays = graphed.counts["graph_replays"]
    assert_bitwise(a.run((x,))[0], values[0] * 2 + 1, "A's result")
    assert graphed.counts["graph_replays"] == replays + 1, "A did not replay once the kept result was gone"


class _Allocator:
    """The allocator's pool checkpoints stood in for (``graph_pool.checkpoint_state``,
    ``restore_state``, ``give_back``): what the pool asked of them."""

    def __init__(self, monkeypatch) -> None:
        self.checkpoints = self.restores = 0
        self.given: list[int] = []
        # Free blocks a cover may take (start, end, small), none unless a test says so.
        self.free: list[tuple[int, int, bool]] = []
        self.taken: list[int] = []
        monkeypatch.setattr(graph_pool, "reuses_dead_results", lambda device: True)
        monkeypatch.setattr(graph_pool, "checkpoint_state", self.checkpoint)
        monkeypatch.setattr(graph_pool, "restore_state", self.restore)
        monkeypatch.setattr(graph_pool, "give_back", self.given.append)
        monkeypatch.setattr(graph_pool, "free_blocks", lambda device, handle, stream: list(self.free))
        monkeypatch.setattr(graph_pool, "allocate_in_pool", self.allocate)
        monkeypatch.setattr(graph_pool, "_pools", {})

    def allocate(self, device, handle, stream, nbytes):
        """The caching allocator's best fit: of the free blocks of the request's pool (small up to
        ``SMALL_REQUEST``) at least ``nbytes`` long, the shortest, then the lowest; split, the
        request at its start; with none, a new segment's (far above the others)."""
        small = nbytes <= graph_pool.SMALL_REQUEST
        fits = [b for b in self.free if b[2] == small and b[1] - b[0] >= nbytes]
        if not fits:
            self.taken.append((1 << 60) + (len(self.taken) << 30))
            return _Block(self.taken[-1], nbytes)
        start, end, _ = min(fits, key=lambda b: (b[1] - b[0], b[0]))
        self.free.remove((start, end, small))
        if end > start + nbytes:
            self.free.append((start + nbytes, end, small))
        self.taken.append(start)
        return _Block(start, nbytes)

    def checkpoint(self, device, handle):
        self.checkpoints += 1
        return self.checkpoints

    def restore(self, device, state):
        assert state == self.checkpoints, "restored a state other than the last capture's"
        self.restores += 1


class _Block:
    """A block a cover allocated in the pool (stand-in): its address and size."""

    def __init__(self, start: int, nbytes: int) -> None:
        self.start, self.nbytes = start, nbytes

    def data_ptr(self) -> int:
        return self.start


class _Stream:
    cuda_stream = 7


class _Member:
    """A program holding a graph (``SharedPool``'s view of it): its write set and results."""

    def __init__(self, writes, results, capture_id=1) -> None:
        self.writes, self.clobbers, self.capture_id = writes, [], capture_id
        self.pool_results = list(results)
        self.storages = [r.untyped_storage() for r in results]
        self.memory = list(results)  # what the pool's memory would hold after disowning them
        self.disowned = False

    def disown(self):
        graphed.GraphedProgram.disown(self)
        self.disowned = True

    def settle(self):
        self.alone = [(s._cdata, torch._C._storage_Use_Count(s._cdata)) for s in self.storages]
        return self


def test_dead_results_go_back_to_the_pool_before_a_capture_and_live_ones_stay_allocated(monkeypatch):
    """Where the pool reuses dead results: a newcomer's results go out disowned (over storages
    that do not own the memory) after the checkpoint; before the next capture the state is
    restored, the dead results given back and the live ones kept allocated; a newcomer whose
    write set holds a result dead at its capture notes it (it must not replay while that one
    lives again), never a live one; old results dead for good are dropped."""
    allocator = _Allocator(monkeypatch)
    pool = graph_pool.for_device(torch.device("cpu"))
    assert pool.reuses
    a = _Member((), [torch.arange(4.0), torch.arange(8.0)])
    pool.admit(a)
    a.settle()
    assert a.disowned and allocator.checkpoints == 1
    assert_bitwise(a.pool_results[1], torch.arange(8.0), "a disowned result")
    kept = a.pool_results[0].detach()  # A's first result handed out and kept; the second dead
    pool.reclaim()
    first, second = pool.results
    assert allocator.restores == 1 and allocator.given == [second.start]
    assert first.allocated and not second.allocated
    everywhere = ((0, 2**64),)
    b = _Member(everywhere, [torch.zeros(2)])
    pool.admit(b)
    b.settle()
    assert b.clobbers == [second], "B may write over A's dead result only"
    assert all(r.owner() is b for r in a.clobbers) and not a.clobbers, "A's write set is empty"
    assert first.in_checkpoint and not second.in_checkpoint and pool.results[-1].in_checkpoint
    # A captured again (its old results followed by weak references from then on), the kept
    # result dropped: every result in the checkpoint is dead (B's too), and A's are gone for good.
    a.capture_id = 2
    a.pool_results = a.storages = []
    del kept
    (mine,) = [r for r in pool.results if r.owner() is b]
    pool.reclaim()
    assert allocator.given == [second.start, first.start, mine.start], "a dead result not given back"
    assert pool.results == [mine], "only B's result may live again (at B's next replay)"


def test_the_pool_is_released_once_no_graph_is_in_it_and_no_result_lives(monkeypatch):
    """A member freed while a result it handed out lives keeps the pool; once that result is
    gone, ``release_if_idle`` (``graphed.free``) gives back what is still allocated and releases
    it."""
    allocator = _Allocator(monkeypatch)
    pool = graph_pool.for_device(torch.device("cpu"))
    a = _Member((), [torch.arange(4.0)])
    pool.admit(a)
    a.settle()
    kept = a.pool_results[0].detach()
    pool.reclaim()  # A's result alive: kept allocated
    assert pool.results[0].allocated
    a.capture_id = 0
    a.pool_results = a.storages = []
    pool._state = "the last checkpoint"
    pool.leave(a)
    assert pool._state is not None and pool.results, "released under a live result"
    assert_bitwise(kept, torch.arange(4.0), "the kept result")
    start = pool.results[0].start
    del kept
    graphed.free()
    assert pool._state is None and pool.results == [] and allocator.given == [start]


class _PoolThatReuses(_PoolThatClobbers):
    """``_PoolThatClobbers`` where the pool reuses dead results (``_Allocator``): each replay
    also writes (NaN) over every result dead at its capture (given back by ``reclaim``, so that
    a capture could place its own memory there), whether or not that result lives again."""

    def __init__(self) -> None:
        super().__init__()
        # The stand-in graphs' kept results by address: the pool's memory, for the test's life
        # (a disowned result handed out reads it after its graph is freed, as pool memory stays).
        self.memory: dict[int, torch.Tensor] = {}

    def capture(self, body, static, device, after_warm_up, pool):
        if pool is not None:
            pool.reclaim()
        graph, results, writes = super().capture(body, static, device, after_warm_up, pool)
        if pool is None:
            return graph, results, writes
        self.memory.update((t.untyped_storage().data_ptr(), t) for t in graph.results if t is not None)
        over = [r for r in pool.results if not r.allocated]
        replay = graph.replay

        def replay_over_dead_results():
            replay()
            for r in over:
                if r.start in self.memory:
                    self.memory[r.start].fill_(float("nan"))
        graph.replay = replay_over_dead_results
        return graph, results, writes


@pytest.mark.parametrize("rule", ["on", "off"])
def test_a_graph_never_replays_over_an_earlier_graphs_result_dead_at_its_capture(rule, cpu_graphs, monkeypatch):
    """A captured first, its result dead when B is captured: B's memory may lie there (the pool
    reuses dead results). While the caller keeps A's result past B's call, B runs eagerly
    (``clobbered``) and the kept result stays as A made it; A, finding its result alive at its
    next call, hands it out as a copy from then on, so B replays again. With the rule off
    (control), B's replay overwrites it."""
    _Allocator(monkeypatch)
    monkeypatch.setattr(graphed, "capture", _PoolThatReuses().capture)
    if rule == "off":
        monkeypatch.setattr(graph_pool, "clobbered", lambda clobbers: False)

    def run_a(x):
        return (x * 2 + 1,)

    def run_b(x):
        return (x.sin(),)

    a = graphed.GraphedProgram(run_a, None, torch.device("cpu"))
    b = graphed.GraphedProgram(run_b, None, torch.device("cpu"))
    x = torch.empty(4, 3)
    torch.manual_seed(0)
    before = dict(graphed.counts)
    for i, v in enumerate(torch.randn(16, 4, 3)):
        x.copy_(v)
        (ya,) = a.run((x,))
        # From call 10 on (both graphed), the caller keeps A's result through B's call.
        kept, want = (ya, ya.clone()) if i >= 10 else (None, None)
        del ya
        (yb,) = b.run((x,))
        assert_bitwise(yb, v.sin(), f"call {i}: B's result")
        del yb
        if kept is not None:
            if rule == "off":
                assert not torch.equal(kept, want), "the stand-in's replay of B did not write over A's result"
                return
            assert_bitwise(kept, want, f"call {i}: A's result kept through B's call")
    delta = _delta(before)
    assert a.phase == b.phase == "graphed", (a.phase, b.phase)
    assert b.clobbers, "A's result dead at B's capture is not noted in B's clobbers"
    assert delta["clobbered"] == 1 and delta["copied_out"] == 1, str(delta)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_training_loop_in_a_pool_that_reuses_dead_results_equals_the_full_path(set_to_none, cpu_graphs,
                                                                                  monkeypatch):
    """``test_a_training_loop_under_worst_case_write_sets_equals_the_full_path`` where the pool
    also reuses dead results, each replay writing over every result dead at its capture too.
    Every step equals the full path bit for bit, and every program replays in the last steps."""
    allocator = _Allocator(monkeypatch)
    delta, tail = _a_kept_output_loop(_PoolThatReuses(), set_to_none, monkeypatch)
    assert allocator.given, "no dead result was given back: the test shows nothing"
    assert tail["last"]["graph_replays"] == 5 * 8 and tail["last"]["clobbered"] == 0, (str(tail["last"]), str(delta))


def _a_result_given_back_and_handed_out_again(monkeypatch):
    """A member's result, dead at a ``reclaim`` (given back), then handed out again by its
    graph's replay: alive in memory the allocator sees free. Returns the stand-in allocator, the
    pool, the member, the result's entry and the tensor over it."""
    allocator = _Allocator(monkeypatch)
    pool = graph_pool.for_device(torch.device("cpu"))
    a = _Member((), [torch.arange(64.0)])
    pool.admit(a)
    a.settle()
    (result,) = pool.results
    pool.reclaim()
    assert allocator.given == [result.start] and not result.allocated
    return allocator, pool, a, result, a.pool_results[0].detach()


def test_a_live_result_in_memory_given_back_is_covered_before_the_next_capture(monkeypatch):
    """A result given back while dead and handed out again by its graph's replay lies in memory
    the allocator sees free: ``cover`` takes the free block it lies in (after a block of the same
    size at a lower address, which the allocator's best fit hands out first), so that the
    capture places nothing there; the placeholders are in the next checkpoint and go back at a
    later capture once no live result lies in them. A capture whose write set still meets a
    live result that is not covered is ``exposed``."""
    allocator, pool, _a, result, kept = _a_result_given_back_and_handed_out_again(monkeypatch)  # A held: current
    lower = result.start - 4096
    block = (result.start - 64, result.end + 64)
    allocator.free = [(lower, lower + block[1] - block[0], True), (*block, True),
                      (result.end + 128, result.end + 256, True)]
    assert pool.exposed(((result.start, result.start + 8),))
    pool.cover(_Stream())
    assert allocator.taken == [lower, result.start - 64], "not the block the live result lies in"
    assert result.allocated and not pool.exposed(((result.start, result.start + 8),))
    b = _Member((), [torch.zeros(2)])
    pool.admit(b)  # the checkpoint: the placeholders in it
    b.settle()
    holders = [p for p in pool.results if isinstance(p, graph_pool.Placeholder)]
    assert [p.start for p in holders] == [lower, result.start - 64] and all(p.in_checkpoint for p in holders)
    pool.reclaim()  # the lower placeholder goes back; the one holding A's live result stays
    assert allocator.given[-2:] == [lower, b.storages[0].data_ptr()], \
        "not given back: the lower placeholder, B's result"
    assert [p for p in pool.results if isinstance(p, graph_pool.Placeholder)] == [holders[1]]
    assert holders[1].holds and result.allocated
    del kept


@pytest.mark.parametrize("segment", ["small", "large"])
def test_a_cover_takes_a_block_larger_than_the_small_pools_requests_in_pieces(segment, monkeypatch):
    """A live result in a 1.5 MiB free block: in the allocator's small pool (2 MiB segments,
    requests of at most 1 MiB) taken in pieces from the block's start (after a 1.25 MiB block
    elsewhere, the best fit for the first piece); in the large pool at once. Session 48, run 2:
    asked for whole, the small pool's block was never taken and the capture dropped."""
    allocator, pool, _a, result, kept = _a_result_given_back_and_handed_out_again(monkeypatch)  # A held: current
    mib, small = 1 << 20, segment == "small"
    start = result.start - mib
    other = start - 4 * mib
    allocator.free = [(other, other + 5 * mib // 4, small), (start, start + 3 * mib // 2, small)]
    pool.cover(_Stream())
    want = [other, start, start + mib] if small else [start]
    assert allocator.taken == want and result.allocated, (allocator.taken, want)
    assert not pool.exposed(((result.start, result.end),))
    del kept


def test_the_pool_is_released_when_its_last_program_is_freed_with_its_module(cpu_graphs, monkeypatch):
    """A program graphed in the pool (reusing dead results) and then deleted, no result of it
    kept: the pool is released at once, as ``torch.cuda.empty_cache`` then gives its memory back
    (session 48, run 3: released only at the next ``graphed.free``; a program's ``__del__``
    held its results while it left)."""
    _Allocator(monkeypatch)
    monkeypatch.setattr(graphed, "capture", _PoolThatReuses().capture)
    a = graphed.GraphedProgram(lambda x: (x * 2 + 1,), None, torch.device("cpu"))
    x = torch.randn(4, 3)
    for _ in range(8):
        a.run((x,))
    pool = a.pool
    assert a.phase == "graphed" and pool is not None and pool.results, a.phase
    del a
    gc.collect()
    assert pool._state is None and pool.results == [] and not pool.members, "the pool was not released"
