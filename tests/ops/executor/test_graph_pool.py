"""The shared graph memory pool (``fuseops/ops/executor/graph_pool.py``) on the CPU, with the stand-in
graphs of ``test_graphed_states.py``: write sets, the rule that a graph never replays over another
graph's live result, a program that keeps meeting live results captured into a private pool. The
stand-in pool here writes over every later capture's results on each replay (the largest write sets
a shared pool could give). Dead results reused: ``test_graph_pool_reuse.py``."""

from __future__ import annotations

import pytest
import torch

from fuseops.ops.executor import graph_pool, graphed
from tests.helpers import assert_bitwise
from tests.ops.executor.test_graphed_states import (  # noqa: F401 (cpu_graphs: a fixture)
    H,
    _delta,
    _same_as_full_path,
    _stand_in_capture,
    blocks,
    cpu_graphs,
    keeping_its_output,
    training_loop,
)


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
@pytest.mark.usefixtures("cpu_graphs")
def test_a_graph_never_replays_over_a_later_graphs_live_result(rule, monkeypatch):
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
@pytest.mark.usefixtures("cpu_graphs")
def test_a_training_loop_under_worst_case_write_sets_equals_the_full_path(set_to_none, monkeypatch):
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


@pytest.mark.usefixtures("cpu_graphs")
def test_a_program_captured_around_live_results_twice_goes_to_a_private_pool(monkeypatch):
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


@pytest.mark.usefixtures("cpu_graphs")
def test_a_later_graphs_result_kept_past_its_graph_is_never_overwritten(monkeypatch):
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
