"""Bad input under torch.compile (aot_eager and inductor, fullgraph or not): never silent, and the
error eager raises. What the trace knows (a list's length and values, a tensor's shape and dtype,
features, extra inputs, routing dtypes and shapes) raises the ValueError / TypeError eager raises,
with its message, as the compiled graph's first step (dynamo would turn a raise while tracing into
``torch._dynamo.exc.Unsupported`` under ``fullgraph=True``); what only the data knows (a tensor's
sizes, expert ids' range) is asserted on the device, a ``RuntimeError`` on the CPU that names the
argument."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import fuseops
from fuseops import moe, ops
from fuseops.ops import _checks

G, H, F, ROWS = 4, 8, 12, 32
SIZE_ASSERT = r"GroupedLinear split_sizes: expected non-negative sizes summing to the input's row count"
TARGETS = [pytest.param(backend, fullgraph, id=f"{backend}-{'fullgraph' if fullgraph else 'breaks'}")
           for backend in ("aot_eager", "inductor") for fullgraph in (True, False)]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp() -> Callable:
    """The MoE expert MLP (two split-size inputs): ``call(x, split_sizes)``."""
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.GroupedLinear(G, H, F), ops.SwiGLU(), ops.GroupedLinear(G, F // 2, H))
    return lambda x, s: model(x, s, s)


def _single() -> Callable:
    torch.manual_seed(0)
    model = fuseops.Sequential(ops.GroupedLinear(G, H, F))
    return lambda x, s: model(x, s)


def _step(fn, sizes, rows: int = ROWS) -> torch.Tensor:
    """Forward and backward, as a training step would."""
    x = torch.randn(rows, H, requires_grad=True)
    y = fn(x, sizes)
    y.sum().backward()
    return y


# (id, model, split sizes): the trace knows what is wrong. The MLP fuses on CPU (GroupedMLP):
# values a list holds; the single op: every form.
TRACE_TIME = [
    ("list-sum", _mlp, [8, 8, 8, 6]),
    ("list-negative", _mlp, [40, -8, 0, 0]),
    ("list-length", _single, [16, 16]),
    ("list-float", _single, [8.0, 8, 8, 8]),
    ("tensor-length", _single, torch.tensor([16, 16])),
    ("tensor-float", _single, torch.tensor([8.0, 8, 8, 8])),
]


@pytest.mark.parametrize("backend, fullgraph", TARGETS)
@pytest.mark.parametrize("name, make, sizes", TRACE_TIME, ids=[c[0] for c in TRACE_TIME])
def test_what_the_trace_knows_raises_the_eager_error(name, make, sizes, backend, fullgraph):
    call = make()
    with pytest.raises((ValueError, TypeError)) as eager:
        _step(call, sizes)
    assert "GroupedLinear split_sizes: expected" in str(eager.value)
    compiled = torch.compile(call, backend=backend, fullgraph=fullgraph)
    with pytest.raises(type(eager.value)) as traced:
        _step(compiled, sizes)
    assert type(traced.value) is type(eager.value) and str(traced.value) == str(eager.value)


def _bad_calls() -> list:
    """(id, call, args) of calls whose other checks fail (features, dtypes, extra inputs, routing),
    each ending in a scalar loss as a training step's would."""
    torch.manual_seed(0)
    seq = fuseops.Sequential(ops.Linear(H, F), ops.GELU())
    lone = ops.Linear(H, F)
    grouped = fuseops.Sequential(ops.GroupedLinear(G, H, F))
    experts = fuseops.Sequential(ops.GroupedLinear(G, H, F), ops.SwiGLU(), ops.GroupedLinear(G, F // 2, H))

    def composition(x, ids):
        x_sorted, sizes, row_map = moe.permute(x, ids, G)
        return moe.unpermute(experts(x_sorted, sizes, sizes), row_map, None)

    ids = torch.zeros(ROWS, 2, dtype=torch.long)
    return [
        ("features", lambda x: seq(x), (torch.randn(ROWS, H + 1),)),
        ("input-dtype", lambda x: seq(x), (torch.randn(ROWS, H).to(torch.int32),)),
        ("lone-op", lambda x: lone(x), (torch.randn(ROWS, H + 1),)),
        ("grouped-features", lambda x: grouped(x, [8] * G), (torch.randn(ROWS, H + 1),)),
        ("extra-input-count", lambda x: grouped(x), (torch.randn(ROWS, H),)),
        ("expert-layer-ids-dtype", lambda x, i: moe.expert_layer(x, i, None, experts), (torch.randn(ROWS, H), ids.float())),
        ("expert-layer-ids-shape", lambda x, i: moe.expert_layer(x, i, None, experts), (torch.randn(ROWS, H), ids[1:])),
        ("composition-ids-dtype", composition, (torch.randn(ROWS, H), ids.float())),
        ("unpermute-row-map-dtype", lambda y, r: moe.unpermute(y, r, None), (torch.randn(2 * ROWS, H), ids.int())),
    ]


@pytest.mark.parametrize("backend, fullgraph", TARGETS)
@pytest.mark.parametrize("case", range(len(_bad_calls())), ids=[c[0] for c in _bad_calls()])
def test_other_failed_checks_raise_the_eager_error(case, backend, fullgraph):
    # Raised while tracing, dynamo would hand a fullgraph caller ``Unsupported`` ("Observed
    # exception"); the compiled graph raises the eager error itself, message and type.
    _, call, args = _bad_calls()[case]
    with pytest.raises((ValueError, TypeError)) as eager:
        call(*args).sum()
    compiled = torch.compile(lambda *a: call(*a).sum(), backend=backend, fullgraph=fullgraph)
    with pytest.raises(type(eager.value)) as traced:
        compiled(*args)
    assert str(traced.value) == str(eager.value)


@pytest.mark.parametrize("backend, fullgraph", TARGETS)
@pytest.mark.parametrize("sizes", [[8, 8, 8, 6], [40, -8, 0, 0]], ids=["sum", "negative"])
def test_tensor_split_sizes_are_asserted_on_the_device(sizes, backend, fullgraph):
    # Eagerly a CPU tensor's values are read (ValueError); traced they are data: a device assert,
    # which on the CPU raises at once, before the result can be used.
    call = _mlp()
    with pytest.raises(ValueError, match=r"GroupedLinear split_sizes: expected"):
        _step(call, torch.tensor(sizes))
    compiled = torch.compile(call, backend=backend, fullgraph=fullgraph)
    with pytest.raises(RuntimeError, match=SIZE_ASSERT):
        _step(compiled, torch.tensor(sizes))


def test_good_calls_after_bad_ones_and_symbolic_sizes_in_messages():
    # Lists of new values retrace with symbolic sizes: the message must still print them; a bad
    # call leaves no graph that a good one would run.
    call = _mlp()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    for sizes in ([8, 8, 8, 8], [10, 6, 8, 8]):
        torch.manual_seed(1)
        y = _step(compiled, sizes)
        torch.manual_seed(1)
        torch.testing.assert_close(y, _step(call, sizes))
    for sizes, pattern in (([8, 8, 8, 6], r"summing to the 32 input rows, got \[8, 8, 8, 6\] \(sum 30\)"),
                           ([12, -4, 8, 16], r"expected non-negative sizes, got \[12, -4, 8, 16\]")):
        with pytest.raises(ValueError, match=pattern):
            _step(compiled, sizes)
    torch.manual_seed(2)
    y = _step(compiled, [1, 2, 3, 26])
    torch.manual_seed(2)
    torch.testing.assert_close(y, _step(call, [1, 2, 3, 26]))


def test_the_device_assert_keeps_row_counts_dynamic():
    # A row count printed in the assert's message would pin the graph to it.
    call = _mlp()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(call, backend=counter, fullgraph=True)
    for rows in (32, 40, 48, 56):
        _step(compiled, torch.tensor([rows // 4] * 4), rows)
    assert counter.frame_count <= 2
    with pytest.raises(RuntimeError, match=SIZE_ASSERT):
        _step(compiled, torch.tensor([16, 16, 16, 15]), 64)


def test_the_device_assert_names_split_sizes_and_rows():
    # The assert eager device split sizes get at every call (GroupedLinear.offsets), on the CPU.
    with pytest.raises(RuntimeError, match=r"GroupedLinear split_sizes: expected non-negative sizes summing to "
                                           r"the 32 input rows"):
        _checks.sizes_asserted("GroupedLinear split_sizes", torch.tensor([8, 8, 8, 6]), 32)
    _checks.sizes_asserted("GroupedLinear split_sizes", torch.tensor([8, 0, 16, 8], dtype=torch.int32), 32)


def test_fused_mlp_with_split_sizes_of_the_wrong_length():
    call = _mlp()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError, match=r"GroupedLinear split_sizes: expected 4 sizes, got 2: \[16, 16\]"):
        _step(compiled, [16, 16])


E, T, K = 4, 8, 2


def _experts() -> fuseops.Sequential:
    torch.manual_seed(0)
    return fuseops.Sequential(ops.GroupedLinear(E, H, 2 * F), ops.SwiGLU(), ops.GroupedLinear(E, F, H))


def _layer(experts):
    return lambda x, ids, w: moe.expert_layer(x, ids, w, experts)


def _composition(experts):
    def run(x, ids, w):
        x_sorted, split_sizes, row_map = moe.permute(x, ids, E)
        return moe.unpermute(experts(x_sorted, split_sizes, split_sizes), row_map, w)
    return run


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("make", [_layer, _composition], ids=["expert_layer", "permute"])
def test_out_of_range_expert_ids_are_asserted_on_the_device(make, backend):
    fn = make(_experts())
    x, w = torch.randn(T, H, requires_grad=True), torch.rand(T, K)
    ids = torch.randint(0, E, (T, K))
    ids[1, 0], ids[5, 1] = E, -1
    with pytest.raises(ValueError, match=r"expert_ids: expected values in \[0, 4\) \(num_experts=4\), got values in "
                                         r"\[-1, 4\]"):
        fn(x, ids, w).sum().backward()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    with pytest.raises(RuntimeError, match=r"expert_ids: expected values in \[0, num_experts=4\)"):
        compiled(x, ids, w).sum().backward()


@pytest.mark.gpu
def test_gpu_eager_device_split_sizes_fail_on_the_stream_without_a_host_sync():
    # A device-side assert leaves the CUDA context unusable: its own process.
    from tests.helpers import run_device_assert

    out = run_device_assert(
        "import torch, fuseops\nfrom fuseops import ops\n"
        "model = fuseops.Sequential(ops.GroupedLinear(4, 8, 12, device='cuda'))\n"
        "x = torch.randn(32, 8, device='cuda')\n"
        "good, bad = torch.tensor([8, 8, 8, 8], device='cuda'), torch.tensor([8, 8, 8, 6], device='cuda')\n"
        "model(x, good)\n"
        "torch.cuda.synchronize()\n"
        "torch.cuda.set_sync_debug_mode('error')\n"
        # A call of a signature seen before: no check runs on the host.
        "model(x, bad)\n"
        "torch.cuda.set_sync_debug_mode('default')\n"
        "torch.cuda.synchronize()\n"
    )
    assert out.returncode != 0 and "device-side assert" in out.stderr, out.stderr
    assert "called a synchronizing CUDA operation" not in out.stderr, out.stderr
