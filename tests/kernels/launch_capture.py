"""The arguments the grouped launchers (and the dense gated one) hand to ``launch``, captured with ``launch`` stubbed and
written as plain data: tensors and descriptor bases by which named tensor (an input or an
output the launcher returned) they point into and where, with shape, strides and dtype;
descriptors by class, shape, strides, block shape, layout and padding. The golden file beside
this module holds what the launchers hand over, written on purpose when an argument is meant
to change, so a cached layout or a cheaper check that changes any argument fails
tests/kernels/test_launch_capture.py. One golden file per tile table: the interpreter's
(TRITON_INTERPRET=1, how the suite runs on CPU) and the GPU's (TRITON_INTERPRET=0 on a machine
without CUDA, where the persistent grids count 4 SMs).

    TRITON_INTERPRET=1 python -m tests.kernels.launch_capture   # rewrite a golden file (only on purpose)
    TRITON_INTERPRET=0 python -m tests.kernels.launch_capture
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from collections.abc import Callable, Iterator

import torch

from fuseops.kernels._triton import INTERPRET
from fuseops.kernels.elementwise.activation_math import Activation
from fuseops.kernels.gemm import dense_gated, grouped, grouped_gated, grouped_gated_bwd
from fuseops.kernels.hopper import wgrad

GOLDEN = pathlib.Path(__file__).with_name(f"launch_capture_golden_{'interpreter' if INTERPRET else 'gpu_configs'}.json")
_MODULES = (grouped, grouped_gated, grouped_gated_bwd, wgrad, dense_gated)


@contextlib.contextmanager
def captured_launches(extra_modules: tuple = ()) -> Iterator[list]:
    """``launch`` of the grouped launchers' modules (and of ``extra_modules``) replaced by one
    that records its call."""
    calls: list = []

    def record(kernel, grid, *args, **kw):
        calls.append((kernel, grid, args, kw))

    modules = _MODULES + tuple(extra_modules)
    saved = [m.launch for m in modules]
    for m in modules:
        m.launch = record
    try:
        yield calls
    finally:
        for m, fn in zip(modules, saved):
            m.launch = fn


def _where(ptr: int, named: dict[str, torch.Tensor]):
    for name, t in named.items():
        start = t.untyped_storage().data_ptr()
        if start <= ptr < start + max(t.untyped_storage().nbytes(), 1):
            return [name, ptr - t.data_ptr()]
    return ["unknown", 0]


def plain(x, named: dict[str, torch.Tensor]):
    """``x`` as JSON data (module docstring)."""
    if isinstance(x, torch.Tensor):
        return ["tensor", _where(x.data_ptr(), named), list(x.shape), list(x.stride()), str(x.dtype)]
    if dataclasses.is_dataclass(x) and hasattr(x, "base"):
        layout = getattr(x, "layout", None)
        return [type(x).__module__ + "." + type(x).__qualname__, plain(x.base, named),
                [int(s) for s in x.shape], [int(s) for s in x.strides], [int(b) for b in x.block_shape],
                repr(layout), x.padding]
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, (tuple, list)):
        return [plain(v, named) for v in x]
    return repr(x)


def _outputs(result) -> list[torch.Tensor | None]:
    return list(result) if isinstance(result, tuple) else [result]


def _run(fn: Callable[[], object], inputs: dict[str, torch.Tensor]) -> list:
    with captured_launches() as calls:
        result = fn()
    named = dict(inputs)
    named.update({f"out{i}": t for i, t in enumerate(_outputs(result)) if isinstance(t, torch.Tensor)})
    return [[kernel.fn.__qualname__ if hasattr(kernel, "fn") else repr(kernel), list(grid),
             plain(list(args), named), {k: plain(v, named) for k, v in kw.items()}]
            for kernel, grid, args, kw in calls]


def _t(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def cases() -> dict[str, tuple[Callable[[], object], dict[str, torch.Tensor]]]:
    """Calls of every changed launcher, in an order where a cache keyed too coarsely (by shape
    without dtype, or the reverse) would hand a later call an earlier call's value: bf16 then
    fp16, 16-byte aligned then not (pointer loads), both weight layouts, both gate layouts."""
    torch.manual_seed(0)
    G, M, K, N, F = 4, 48, 64, 96, 32
    out = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        tag = str(dtype).removeprefix("torch.")
        a, w = _t(M, K, dtype=dtype), _t(G, N, K, dtype=dtype)
        offsets = torch.tensor([0, 10, 10, 40, M])
        bias, rs, agi = _t(G, N, dtype=dtype), _t(M, dtype=dtype), _t(M, N, dtype=dtype)
        a_odd = _t(M, K + 1, dtype=dtype)[:, 1:]  # rows 2 bytes off 16
        named = {"a": a, "w": w, "offsets": offsets, "bias": bias, "rs": rs, "agi": agi, "a_odd": a_odd}
        out[f"grouped fwd {tag}"] = (lambda a=a, w=w, o=offsets, b=bias, r=rs: grouped.grouped_gemm(
            a, w.transpose(1, 2), o, bias=b, row_scale=r, act=Activation.GELU_TANH, save_preact=True), named)
        out[f"grouped dgrad {tag}"] = (lambda a=agi, w=w, o=offsets, z=agi: grouped.grouped_gemm(
            a, w, o, act=Activation.GELU_TANH, act_grad_input=z), named)
        out[f"grouped fwd unaligned {tag}"] = (lambda a=a_odd, w=w, o=offsets: grouped.grouped_gemm(
            a, w[:, :, 1:].transpose(1, 2), o), named)
        w1, dy, z = _t(G, 2 * F, K, dtype=dtype), _t(M, K, dtype=dtype), _t(M, 2 * F, dtype=dtype)
        w2, probs, b1 = _t(G, K, F, dtype=dtype), torch.rand(M), _t(G, 2 * F, dtype=dtype)
        named_g = dict(named, w1=w1, dy=dy, z=z, w2=w2, probs=probs, b1=b1)
        for inter in (False, True):
            itag = f"{'interleaved' if inter else 'halves'} {tag}"
            out[f"gated fwd {itag}"] = (lambda a=a, w=w1, o=offsets, b=b1, p=probs, i=inter:
                grouped_gated.grouped_gemm_gated(a, w.transpose(1, 2), o, bias=b, act=Activation.SILU,
                                                 interleaved=i, probs=p, save_preact=True), named_g)
            out[f"gated fwd plain {itag}"] = (lambda a=a, w=w1, o=offsets, i=inter:
                grouped_gated.grouped_gemm_gated(a, w.transpose(1, 2), o, act=Activation.SILU,
                                                 interleaved=i), named_g)
            out[f"gated dgrad {itag}"] = (lambda d=dy, w=w2, o=offsets, z=z, p=probs, i=inter:
                grouped_gated_bwd.grouped_gemm_dgrad_gated(d, w, o, z, act=Activation.SILU, interleaved=i,
                                                           probs=p, want_h=True, out=z), named_g)
            out[f"gated dgrad plain {itag}"] = (lambda d=dy, w=w2, o=offsets, z=z, i=inter:
                grouped_gated_bwd.grouped_gemm_dgrad_gated(d, w, o, z, act=Activation.SILU, interleaved=i),
                named_g)
            # The dense gated GEMM (Linear + bias + SwiGLU / GLU), with a Linear's weight.
            b_dense, y_dense = _t(2 * F, K, dtype=dtype), _t(M, F, dtype=dtype)
            named_d = dict(named, b_dense=b_dense, y_dense=y_dense, b1_dense=b1[0])
            out[f"dense gated {itag}"] = (lambda a=a, w=b_dense, b=b1[0], i=inter: dense_gated.gemm_gated(
                a, w.t(), bias=b, act=Activation.SILU, interleaved=i, save_preact=True), named_d)
            out[f"dense gated plain {itag}"] = (lambda a=a, w=b_dense, i=inter: dense_gated.gemm_gated(
                a, w.t(), act=Activation.GELU_TANH, interleaved=i, clamped=True, limit=3.0, alpha=1.5), named_d)
            out[f"dense gated out {itag}"] = (lambda a=a, w=b_dense, y=y_dense, i=inter: dense_gated.gemm_gated(
                a, w.t(), act=Activation.SILU, interleaved=i, out=y), named_d)
            out[f"dense gated unaligned {itag}"] = (lambda a=a_odd, w=b_dense, i=inter: dense_gated.gemm_gated(
                a, w.t(), act=Activation.SILU, interleaved=i, save_preact=True), named_d)
            out[f"dense gated row-major b {itag}"] = (lambda a=a, w=b_dense, i=inter: dense_gated.gemm_gated(
                a, w.t().contiguous(), act=Activation.SILU, interleaved=i, save_preact=True), named_d)
        if dtype != torch.float32:
            x, dyw = _t(M, 2 * F, dtype=dtype), _t(M, K, dtype=dtype)
            main_grad = torch.zeros(G, K, 2 * F)
            named_w = dict(named, x=x, dyw=dyw, main_grad=main_grad)
            out[f"wgrad {tag}"] = (lambda d=dyw, x=x, o=offsets: wgrad.grouped_wgrad_hopper(d, x, o), named_w)
            out[f"wgrad float32 dw {tag}"] = (lambda d=dyw, x=x, o=offsets: wgrad.grouped_wgrad_hopper(
                d, x, o, out_dtype=torch.float32), named_w)
            out[f"wgrad main_grad {tag}"] = (lambda d=dyw, x=x, o=offsets, m=main_grad:
                wgrad.grouped_wgrad_hopper(d, x, o, main_grad=m), named_w)
    return out


def capture_all() -> dict[str, list]:
    return {name: _run(fn, named) for name, (fn, named) in cases().items()}


if __name__ == "__main__":
    lines = [f"{json.dumps(name)}: {json.dumps(calls)}" for name, calls in capture_all().items()]
    GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {GOLDEN}")
