"""The expert-parallel cost model (benchmarks/ep_cost_model.py): the link interpolates its sweep
and keeps its largest bandwidth beyond it; the compute fit reproduces the measurements it came
from (one measurement: a cost per row alone); the step without pieces is compute plus four
exchanges plus the gathers; pieces hide the exchange when the link is fast beside the compute and
cannot when it is slow; beyond a node the network sets the exchange."""

import math

import pytest

from benchmarks import ep_cost_model as cm

SHAPE = cm.Shape(tokens=1024, top_k=4, hidden=256, ffn=128, experts=16)


def _link(bytes_per_s: float, world: int = 2) -> cm.Link:
    """A link of constant bandwidth (remote bytes per second) measured at ``world`` ranks."""
    return cm.Link(tuple((b, b * (world - 1) / world / bytes_per_s) for b in (2**20, 2**24, 2**28)), world)


def test_link_interpolates_and_extrapolates():
    link = cm.Link(cm.H200_SWEEP, cm.H200_SWEEP_WORLD)
    for size, seconds in cm.H200_SWEEP:
        assert math.isclose(link.seconds(link.remote(size)), seconds, rel_tol=1e-12)
    sizes = [2**k for k in range(20, 33)]
    times = [link.seconds(s) for s in sizes]
    assert times == sorted(times), "more bytes must not take less time"
    largest = link.remote(cm.H200_SWEEP[-1][0])
    assert math.isclose(link.bandwidth(4 * largest), link.bandwidth(largest), rel_tol=1e-12)
    assert link.seconds(1) == cm.H200_SWEEP[0][1], "below the sweep: its smallest time (latency)"
    with pytest.raises(ValueError, match="points: expected"):
        cm.Link(((0, 1.0),), 2)


def test_compute_fit_reproduces_its_measurements():
    measured = {4096: 2e-3, 1024: 1e-3}
    compute = cm.Compute.from_one_gpu(SHAPE, measured)
    for tokens, step in measured.items():
        rows = tokens * SHAPE.top_k
        got = compute.seconds(SHAPE.experts, rows, True) + compute.seconds(SHAPE.experts, rows, False)
        assert math.isclose(got, step, rel_tol=1e-9)
        assert math.isclose(compute.seconds(SHAPE.experts, rows, True), step * cm.FORWARD_SHARE, rel_tol=1e-9)
    alone = cm.Compute.from_one_gpu(SHAPE, {1024: 1e-3})
    assert alone.forward[0] == alone.backward[0] == 0.0
    assert math.isclose(alone.seconds(SHAPE.experts, 2 * 1024 * SHAPE.top_k, False), 2 * 1e-3 * 2 / 3)
    with pytest.raises(ValueError, match="one or two token counts"):
        cm.Compute.from_one_gpu(SHAPE, {})


def _compute(per_row_s: float) -> cm.Compute:
    """No per-expert cost: compute proportional to the rows (a third forward)."""
    return cm.Compute((0.0, per_row_s / 3), (0.0, 2 * per_row_s / 3))


def test_one_piece_is_compute_plus_four_exchanges_plus_gathers():
    link, compute = _link(1e11), _compute(1e-7)
    p = cm.predict(SHAPE, 2, compute, link, hbm_bytes_per_s=1e12)
    rows_bytes = SHAPE.rows() * SHAPE.hidden * SHAPE.element_bytes
    one = link.seconds(rows_bytes / 2)
    assert math.isclose(p.exchange_s, one) and math.isclose(p.exposed_s, 4 * one)
    assert math.isclose(p.extra_s, 8 * rows_bytes / 1e12)
    assert math.isclose(p.step_s, p.compute_s + 4 * one + p.extra_s)
    alone = cm.predict(SHAPE, 1, compute, link)
    assert alone.step_s == alone.compute_s and alone.exposed_s == 0


def test_pieces_hide_a_fast_link_and_not_a_slow_one():
    compute = _compute(1e-7)
    fast = cm.predict(SHAPE, 2, compute, _link(1e15), pieces=4, hbm_bytes_per_s=math.inf)
    assert fast.exposed_s < 1e-3 * fast.compute_s and math.isclose(fast.step_s, fast.compute_s, rel_tol=1e-3)
    slow_link = _link(1e8)
    slow = cm.predict(SHAPE, 2, compute, slow_link, pieces=4, hbm_bytes_per_s=math.inf)
    # The link is busy for four exchanges a step, whatever the schedule: it sets the step.
    assert slow.step_s >= 4 * slow.exchange_s * (1 - 1e-12)
    assert slow.step_s < cm.predict(SHAPE, 2, compute, slow_link).step_s
    # Middle ground: more pieces expose less of the exchange.
    mid = _link(5e10)
    exposed = [cm.predict(SHAPE, 2, compute, mid, pieces=k, hbm_bytes_per_s=math.inf).exposed_s for k in (1, 2, 8)]
    assert exposed == sorted(exposed, reverse=True) and exposed[-1] < exposed[0]


def test_each_extra_piece_sums_the_weight_gradient_once():
    compute, link = _compute(1e-7), _link(1e15)
    for pieces in (1, 3):
        p = cm.predict(SHAPE, 2, compute, link, pieces=pieces, hbm_bytes_per_s=1e12)
        # The own rows and the remote pieces: ``pieces`` sums of the 8 local experts' weights.
        assert math.isclose(p.extra_s, pieces * 3 * SHAPE.weight_bytes(8) / 1e12)


def test_beyond_a_node_the_network_sets_the_exchange():
    link = _link(1e15, world=2)
    rows_bytes = SHAPE.rows() * SHAPE.hidden * SHAPE.element_bytes
    got = cm.exchange_seconds(SHAPE, 16, link, gpus_per_node=8, network_gbps=8.0)
    assert math.isclose(got, rows_bytes * 8 / 16 / 1e9)
    inside = cm.exchange_seconds(SHAPE, 8, link, gpus_per_node=8, network_gbps=8.0)
    assert inside < got and math.isclose(inside, link.seconds(rows_bytes * 7 / 8))


def test_main_prints_every_world_size(capsys):
    import sys

    argv, sys.argv = sys.argv, ["ep_cost_model"]
    try:
        cm.main()
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert rows == ["2", "4", "8", "16", "64"]
