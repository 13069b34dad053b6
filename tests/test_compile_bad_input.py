"""Bad input under torch.compile: the error eager raises, its type and its message, values and all,
on the first call and after a recompile, with static and dynamic shapes, fullgraph or not,
aot_eager and inductor.

What the trace knows (shapes, dtypes, a list's values, extra inputs) is checked while tracing and
raised by the compiled graph as its first step (a raise while tracing would reach a fullgraph
caller as dynamo's ``Unsupported``), its message formatted from sizes that may be symbolic. What
only the data knows (a tensor's split sizes, expert ids, a row map) is checked by the compiled
graph when it runs, by eager's own check: on the CPU the same ``ValueError``, values and all; on
a device the same device-side assert, naming the argument and the bound."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import fuseops
from fuseops import moe, ops
from fuseops.ops import _checks
from fuseops.quant import recipes

G, H, F = 4, 8, 12
# The second row count recompiles: dynamo makes the row count (and a size list's ints) symbolic.
ROW_COUNTS = (4, 5)
# (backend, fullgraph, dynamic). ``dynamic=None``: the first call traces static shapes, the second
# recompiles with a symbolic row count; ``dynamic=True``: symbolic from the first call. Without
# fullgraph, dynamo makes the same graph where it can, and breaks (eager raises) where not.
MODES = [pytest.param(backend, fullgraph, dynamic,
                      id=f"{backend}-{'fullgraph' if fullgraph else 'breaks'}-{'dynamic' if dynamic else 'recompiled'}")
         for backend in ("aot_eager", "inductor") for fullgraph, dynamic in ((True, None), (True, True), (False, True))]
# Each message is made while dynamo traces, before the backend; the backend decides only how the
# compiled graph runs the two operators that raise (``fuseops::bad_input``, and
# ``fuseops::run_time_check`` of split sizes and routing ranges): inductor runs one case of each.
INDUCTOR_CASES = ("features", "list-sum", "tensor-sum", "expert-layer-ids-range", "unpermute-row-map-range")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _x(rows: int, features: int = H) -> torch.Tensor:
    return torch.randn(rows, features, requires_grad=True)


def _ids(rows: int, bad: int | None = None) -> torch.Tensor:
    ids = torch.arange(2 * rows).view(rows, 2) % G
    if bad is not None:
        ids[rows // 2, 1] = bad
    return ids


def _row_map(rows: int, bad: int | None = None) -> torch.Tensor:
    row_map = torch.arange(2 * rows).view(rows, 2)
    if bad is not None:
        row_map[1, 0] = bad
    return row_map


def _cases() -> dict[str, tuple[Callable, Callable[[int], tuple]]]:
    """id -> (call, args(rows)): a call whose checks fail for every row count, ending in a scalar
    loss as a training step's would."""
    torch.manual_seed(0)
    dense = fuseops.Sequential(ops.RMSNorm(16), ops.Linear(16, 32), ops.GELU())
    lone = ops.Linear(16, 32)
    grouped = fuseops.Sequential(ops.GroupedLinear(G, H, F))
    experts = fuseops.Sequential(ops.GroupedLinear(G, H, F), ops.SwiGLU(), ops.GroupedLinear(G, F // 2, H))
    scaled = fuseops.Sequential(ops.SwiGLU(scaled=True))

    def mlp(x, s):  # fuses on the CPU (GroupedMLP)
        return experts(x, s, s)

    def composition(x, ids):
        x_sorted, sizes, row_map = moe.permute(x, ids, G)
        return moe.unpermute(experts(x_sorted, sizes, sizes), row_map, None)

    def layer(x, ids, w=None):
        return moe.expert_layer(x, ids, w, experts)

    def unpermute(y, row_map, w=None):
        return moe.unpermute(y, row_map, w)

    def permute(x, ids):
        return moe.permute(x, ids, G)[0]

    def quantized(x, offsets, rows):
        return fuseops.quantize(x, recipes.MXFP8(), offsets=offsets, rows=rows).dequantize()

    return {
        # Known while tracing.
        "features": (dense, lambda r: (_x(r, 17),)),
        "input-dtype": (dense, lambda r: (torch.ones(r, 16, dtype=torch.int32),)),
        "parameter-dtype": (dense, lambda r: (_x(r, 16).half(),)),
        "lone-op": (lone, lambda r: (_x(r, 17),)),
        "layer-norm": (fuseops.Sequential(ops.LayerNorm(16)), lambda r: (_x(r, 17),)),
        "gated-odd-features": (fuseops.Sequential(ops.SwiGLU()), lambda r: (_x(r, 5),)),
        "probs-shape": (scaled, lambda r: (_x(r), torch.rand(r + 1))),
        "probs-dtype": (scaled, lambda r: (_x(r), torch.ones(r, dtype=torch.int64))),
        "residual-shape": (fuseops.Sequential(ops.AddExtraInput()), lambda r: (_x(r), torch.randn(r, 3))),
        "reshape": (fuseops.Sequential(ops.Reshape((3, -1))), lambda r: (_x(r),)),  # 8r % 3 != 0
        "extra-input-count": (grouped, lambda r: (_x(r),)),
        "grouped-features": (grouped, lambda r: (_x(r, H + 1), [r, 0, 0, 0])),
        "list-sum": (mlp, lambda r: (_x(r), [1, 1, 1, r - 4])),
        "list-negative": (mlp, lambda r: (_x(r), [r + 1, -1, 0, 0])),
        "list-length": (grouped, lambda r: (_x(r), [r, 0])),
        "list-length-fused": (mlp, lambda r: (_x(r), [r, 0])),
        "list-float": (grouped, lambda r: (_x(r), [float(r), 0, 0, 0])),
        "tensor-length": (grouped, lambda r: (_x(r), torch.tensor([r, 0]))),
        "tensor-float": (grouped, lambda r: (_x(r), torch.tensor([float(r), 0, 0, 0]))),
        "permute-ids-dtype": (permute, lambda r: (_x(r), _ids(r).float())),
        "permute-ids-shape": (permute, lambda r: (_x(r), _ids(r + 1))),
        "unpermute-row-map-dtype": (unpermute, lambda r: (_x(2 * r), _row_map(r).int())),
        "unpermute-row-map-shape": (unpermute, lambda r: (_x(2 * r), _row_map(r)[:, :1])),
        "unpermute-weights-shape": (unpermute, lambda r: (_x(2 * r), _row_map(r), torch.rand(r, 3))),
        "expert-layer-features": (layer, lambda r: (_x(r, H + 1), _ids(r))),
        "expert-layer-ids-dtype": (layer, lambda r: (_x(r), _ids(r).float())),
        "expert-layer-weights-shape": (layer, lambda r: (_x(r), _ids(r), torch.rand(r, 3))),
        "composition-ids-shape": (composition, lambda r: (_x(r), _ids(r)[1:])),
        # Known only from the data: checked by the compiled graph when it runs.
        "tensor-sum": (mlp, lambda r: (_x(r), torch.tensor([1, 1, 1, r - 4]))),
        "tensor-negative": (mlp, lambda r: (_x(r), torch.tensor([r + 1, -1, 0, 0]))),
        "tensor-sum-single": (grouped, lambda r: (_x(r), torch.tensor([1, 1, 1, r - 4]))),
        "permute-ids-range": (permute, lambda r: (_x(r), _ids(r, bad=G))),
        "unpermute-row-map-range": (unpermute, lambda r: (_x(2 * r), _row_map(r, bad=-1))),
        "expert-layer-ids-range": (layer, lambda r: (_x(r), _ids(r, bad=-1))),
        "composition-ids-range": (composition, lambda r: (_x(r), _ids(r, bad=G))),
        "quantize-offsets": (quantized, lambda r: (_x(r), torch.tensor([0, 2, r + 1]), None)),
        "quantize-rows": (quantized, lambda r: (_x(r), torch.tensor([0, r]), torch.tensor([0, r, 1]))),
    }


def _step(call: Callable) -> Callable:
    return lambda *args: call(*args).sum()


def _eager_error(call: Callable, args: tuple) -> ValueError | TypeError:
    with pytest.raises((ValueError, TypeError)) as eager:
        _step(call)(*args)
    return eager.value


def _case_modes() -> list:
    return [pytest.param(case, *mode.values, id=f"{case}-{mode.id}") for case in _cases() for mode in MODES
            if mode.values[0] == "aot_eager" or case in INDUCTOR_CASES]


@pytest.mark.parametrize("case, backend, fullgraph, dynamic", _case_modes())
def test_compiled_errors_are_eagers(case, backend, fullgraph, dynamic):
    call, args = _cases()[case]
    compiled = torch.compile(_step(call), backend=backend, fullgraph=fullgraph, dynamic=dynamic)
    for rows in ROW_COUNTS:
        eager = _eager_error(call, args(rows))
        with pytest.raises((ValueError, TypeError)) as traced:
            compiled(*args(rows))
        assert (type(traced.value), str(traced.value)) == (type(eager), str(eager))


@pytest.mark.parametrize("dynamic", [None, True], ids=["recompiled", "dynamic"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_bad_call_after_good_ones_of_two_row_counts(backend, dynamic):
    # Good calls of two row counts make dynamo's shapes dynamic; a bad feature size then
    # fails as eagerly, and good calls go on working.
    torch.manual_seed(0)
    dense = fuseops.Sequential(ops.RMSNorm(16), ops.Linear(16, 32), ops.GELU())
    compiled = torch.compile(_step(dense), backend=backend, fullgraph=True, dynamic=dynamic)
    for rows in (4, 6):
        x = _x(rows, 16)
        torch.testing.assert_close(compiled(x), _step(dense)(x))
    for rows, features in ((5, 17), (7, 15)):
        eager = _eager_error(dense, (_x(rows, features),))
        with pytest.raises(ValueError) as traced:
            compiled(_x(rows, features))
        assert str(traced.value) == str(eager) == f"RMSNorm input: expected shape [..., 16], got [{rows}, {features}]"
    x = _x(9, 16)
    torch.testing.assert_close(compiled(x), _step(dense)(x))


def test_good_calls_after_bad_ones_and_symbolic_sizes_in_messages():
    # Lists of new values retrace with symbolic sizes: the message must still print them; a bad
    # call leaves no graph that a good one would run.
    call = _cases()["list-sum"][0]
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)

    def step(fn, sizes):
        torch.manual_seed(1)
        x = _x(32)
        y = fn(x, sizes)
        y.sum().backward()
        return y, x.grad
    for sizes in ([8, 8, 8, 8], [10, 6, 8, 8]):
        torch.testing.assert_close(step(compiled, sizes), step(call, sizes))
    for sizes, pattern in (([8, 8, 8, 6], r"summing to the 32 input rows, got \[8, 8, 8, 6\] \(sum 30\)"),
                           ([12, -4, 8, 16], r"expected non-negative sizes, got \[12, -4, 8, 16\]")):
        with pytest.raises(ValueError, match=pattern):
            step(compiled, sizes)
    torch.testing.assert_close(step(compiled, [1, 2, 3, 26]), step(call, [1, 2, 3, 26]))


def test_checking_tensor_split_sizes_keeps_row_counts_dynamic():
    # The row count reaches the run-time check as a symbolic int: no graph per row count.
    call = _cases()["tensor-sum"][0]
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(call, backend=counter, fullgraph=True)
    for rows in (32, 40, 48, 56):
        compiled(_x(rows), torch.tensor([rows // 4] * 4)).sum().backward()
    assert counter.frame_count <= 2
    with pytest.raises(ValueError, match=r"GroupedLinear split_sizes: expected sizes summing to the 64 input rows, "
                                         r"got \[16, 16, 16, 15\] \(sum 63\)"):
        compiled(_x(64), torch.tensor([16, 16, 16, 15]))
    assert counter.frame_count <= 2


def test_the_device_assert_names_split_sizes_and_rows():
    # The assert eager device split sizes get at every call (GroupedLinear.offsets), on the CPU.
    with pytest.raises(RuntimeError, match=r"GroupedLinear split_sizes: expected non-negative sizes summing to "
                                           r"the 32 input rows"):
        _checks.sizes_asserted("GroupedLinear split_sizes", torch.tensor([8, 8, 8, 6]), 32)
    offsets = _checks.sizes_asserted("GroupedLinear split_sizes", torch.tensor([8, 0, 16, 8], dtype=torch.int32), 32)
    assert offsets.tolist() == [0, 8, 8, 24, 32]


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


GPU_COMPILED = {
    "split-sizes": (
        "model = fuseops.Sequential(ops.GroupedLinear(4, 8, 12, device='cuda'))\n"
        "step = torch.compile(lambda x, s: model(x, s).sum(), backend='{backend}', fullgraph=True, dynamic=True)\n"
        "x = torch.randn(40, 8, device='cuda', requires_grad=True)\n"
        "step(x, torch.tensor([10, 10, 10, 10], device='cuda')).backward()\n"
        "torch.cuda.synchronize()\n"
        "step(x, torch.tensor([10, 10, 10, 9], device='cuda'))\n",
        "GroupedLinear split_sizes: expected non-negative sizes summing to the 40 input rows"),
    "expert-ids": (
        "experts = fuseops.Sequential(ops.GroupedLinear(4, 8, 24, device='cuda'), ops.SwiGLU(), "
        "ops.GroupedLinear(4, 12, 8, device='cuda'))\n"
        "step = torch.compile(lambda x, i: moe.expert_layer(x, i, None, experts).sum(), backend='{backend}', "
        "fullgraph=True, dynamic=True)\n"
        "x = torch.randn(6, 8, device='cuda', requires_grad=True)\n"
        "ids = torch.arange(12, device='cuda').view(6, 2) % 4\n"
        "step(x, ids).backward()\n"
        "torch.cuda.synchronize()\n"
        "ids[3, 1] = 4\n"
        "step(x, ids)\n",
        "expert_ids: expected values in [0, 4) (num_experts=4)"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("case", list(GPU_COMPILED))
def test_gpu_compiled_device_checks_name_the_argument_and_the_bound(case, backend):
    # Device values stay on the device: the compiled graph makes eager's device assert, whose
    # message names the bound (a row count the trace held symbolic) where eager's does.
    from tests.helpers import run_device_assert

    code, message = GPU_COMPILED[case]
    out = run_device_assert("import torch, fuseops\nfrom fuseops import moe, ops\n" + code.format(backend=backend)
                            + "torch.cuda.synchronize()\n")
    assert out.returncode != 0 and "device-side assert" in out.stderr, out.stderr
    # The kernel's assert prints the message (the exception says "device-side assert triggered").
    assert message in out.stdout + out.stderr, out.stdout + out.stderr
