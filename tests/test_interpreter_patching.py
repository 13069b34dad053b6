"""The suite's faster interpreter (tests/interpreter_patching.py) runs kernels as Triton's own does."""

import os

import pytest
import torch
import triton
import triton.language as tl

from fuseops.kernels._triton import INTERPRET
from tests.interpreter_patching import _SkipWhenPatched, skip_repeated_patching

pytestmark = pytest.mark.skipif(not INTERPRET, reason="Triton's interpreter runs on CPU-only machines")


@triton.jit
def _inner(x):
    return tl.where(x > 0, x * 2.0, tl.exp(x))


@triton.jit
def _outer(x):
    return _inner(x) + _inner(-x)


@triton.jit
def _kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(y_ptr + offsets, _outer(x) + tl.sum(x, axis=0), mask=mask)


def _run(x):
    y = torch.empty_like(x)
    _kernel[(triton.cdiv(x.numel(), 16),)](x, y, x.numel(), BLOCK=16)
    return y


@pytest.fixture
def shipped_and_fast(monkeypatch):
    """Triton's own ``_patch_lang`` and the fast path around it, installed for the test."""
    from triton.runtime import interpreter

    shipped = interpreter._patch_lang
    shipped = getattr(shipped, "patch_lang", shipped)
    fast = _SkipWhenPatched(shipped)
    monkeypatch.setattr(interpreter, "_patch_lang", fast)
    return shipped, fast


def test_the_suite_runs_the_fast_path():
    from triton.runtime import interpreter

    if os.environ.get("FUSEOPS_INTERPRETER_AS_SHIPPED") == "1":
        pytest.skip("FUSEOPS_INTERPRETER_AS_SHIPPED=1: the interpreter runs unchanged")
    assert skip_repeated_patching()
    assert isinstance(interpreter._patch_lang, _SkipWhenPatched)


def test_device_functions_give_the_values_of_tritons_own_patching(shipped_and_fast, monkeypatch):
    from triton.runtime import interpreter

    x = torch.randn(40)
    fast = _run(x)
    monkeypatch.setattr(interpreter, "_patch_lang", shipped_and_fast[0])
    assert torch.equal(fast, _run(x))
    blocks = x.split(16)
    sums = torch.cat([b.sum().expand(len(b)) for b in blocks])
    expected = torch.where(x > 0, 2 * x, x.exp()) + torch.where(-x > 0, -2 * x, (-x).exp()) + sums
    torch.testing.assert_close(fast, expected)


def test_the_language_is_put_back_after_a_kernel(shipped_and_fast):
    _run(torch.randn(20))
    assert tl.core.is_builtin(tl.where) and tl.core.is_builtin(tl.tensor.__add__) and tl.core.is_builtin(tl.math.exp)


def test_inside_a_kernel_a_device_call_skips_and_outside_it_patches(shipped_and_fast, monkeypatch):
    from triton.runtime import interpreter

    fast = shipped_and_fast[1]
    scopes = []

    def record(fn):
        scope = fast(fn)
        scopes.append((fn.__name__, len(scope._changes)))
        return scope

    monkeypatch.setattr(interpreter, "_patch_lang", record)
    _run(torch.randn(16))
    assert scopes[0][0] == "_kernel" and scopes[0][1] > 0
    assert {"_outer", "_inner"} <= {name for name, _ in scopes[1:]}
    # (Triton's own jit functions, such as tl.sum, read tl.core, which the first of them patches.)
    assert all(changes == 0 for name, changes in scopes[1:] if name in ("_outer", "_inner"))


@triton.jit
def _wrapping_kernel(y_ptr, a):
    offsets = tl.arange(0, 16)
    tl.store(y_ptr + offsets, tl.full((16,), 1, tl.int32) * a * 4)


def test_the_shipped_sanitizer_reports_no_overflow(monkeypatch):
    """The premise of ``skip_overflow_checks``: with the sanitizer on, as shipped, an int32 product
    past 2^31 wraps without an error in the interpreter, so turning it off loses no report."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    options = builder.options
    monkeypatch.setattr(builder, "options", dataclasses.replace(options, sanitize_overflow=True))
    y = torch.empty(16, dtype=torch.int32)
    _wrapping_kernel[(1,)](y, 2**30)
    assert (y == 0).all()  # 2^32 wrapped to 0 in int32
    monkeypatch.setattr(builder, "options", dataclasses.replace(options, sanitize_overflow=False))
    y.fill_(1)
    _wrapping_kernel[(1,)](y, 2**30)
    assert (y == 0).all()


def test_the_suite_runs_without_the_sanitizer():
    from triton.runtime import interpreter

    if os.environ.get("FUSEOPS_INTERPRETER_AS_SHIPPED") == "1":
        pytest.skip("FUSEOPS_INTERPRETER_AS_SHIPPED=1: the interpreter runs unchanged")
    assert not interpreter.interpreter_builder.options.sanitize_overflow
