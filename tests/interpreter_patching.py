"""Triton's interpreter without work whose results it discards: the CPU suite's largest cost.

About 70 % of the suite's time goes to tests running kernels through the interpreter (``pytest
--durations``, by test name). Two changes, each leaving every interpreted value as Triton's own gives it:

Under ``TRITON_INTERPRET=1`` Triton 3.6 swaps ``triton.language``'s builtins for interpreted ones
(``interpreter._patch_lang``) when a kernel starts, and puts them back when it ends. It also does
so on every call of a ``@triton.jit`` device function inside the kernel, where the builtins are
already swapped: each call walks ``tl``, ``tl.tensor`` and ``tl.math`` with ``inspect.getmembers``
(~1 ms) and then finds nothing left to swap. Kernels built from device functions (the activation
and quantize helpers, ``dot``) make thousands of such calls a step: a third of an interpreted
NVFP4 grouped-MLP step went there (64 rows, this project's CPU).

``skip_repeated_patching()`` lets a call skip the walk when every builtin it would swap is
swapped already, and runs Triton's own patching otherwise, so the interpreted values are the
same: nothing is swapped that Triton would not swap, and the kernel's own restore is untouched.
``skip_overflow_checks()`` turns off the interpreter's integer overflow sanitizer
(``InterpreterOptions.sanitize_overflow``), which reports nothing there: it does every int32 add,
subtract and multiply of a kernel's index maths again in int64 and compares it with the int32
range, then hands the comparison to ``device_assert``, which drops it unless
``InterpreterOptions.debug`` (False in the interpreter; Triton 3.6's ``semantic.device_assert``).
An int32 product that wraps runs silently either way (``test_the_shipped_sanitizer_reports_no
_overflow`` keeps that premise checked). The work it drops was about half of an interpreted
step: an expert layer's step with main_grad 12.5 -> 5.8 s under cProfile; an NVFP4 grouped-MLP
step 3.7 -> 2.5 -> 1.8 s with the first change, then both. ``FUSEOPS_INTERPRETER_AS_SHIPPED=1``
(tests/conftest.py) runs the suite with neither change.

Both change only Triton versions whose interpreter they know (the names they read exist);
anywhere else the interpreter runs as shipped.
"""

import dataclasses

import triton.language as tl

try:
    from triton.runtime import interpreter
except ImportError:  # a Triton without the interpreter module: nothing to speed up
    interpreter = None


def _builtin_names(obj) -> tuple[str, ...]:
    return tuple(name for name in dir(obj) if tl.core.is_builtin(getattr(obj, name, None)))


class _SkipWhenPatched:
    """``interpreter._patch_lang`` with a fast path: an empty scope when nothing is left to patch."""

    def __init__(self, patch_lang):
        self.patch_lang = patch_lang
        # The builtin names of every object Triton patches, read while nothing is patched.
        self.names = {id(obj): _builtin_names(obj) for obj in self._objects([tl, tl.core])}

    @staticmethod
    def _objects(langs):
        objects = [tl.core.tensor_descriptor_base]
        for lang in langs:
            objects += [lang, lang.tensor] + ([tl.math] if lang is tl else [])
        return objects

    def _patched(self, obj) -> bool:
        return not any(tl.core.is_builtin(getattr(obj, name, None)) for name in self.names[id(obj)])

    def __call__(self, fn):
        langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        if langs and all(self._patched(obj) for obj in self._objects(langs)):
            return interpreter._LangPatchScope()
        return self.patch_lang(fn)


def skip_repeated_patching() -> bool:
    """Install the fast path into Triton's interpreter; returns whether it was installed."""
    known = interpreter is not None and all(
        hasattr(interpreter, name) for name in ("_patch_lang", "_LangPatchScope", "InterpretedFunction")
    ) and hasattr(tl.core, "tensor_descriptor_base") and hasattr(tl.core, "is_builtin")
    if not known or isinstance(interpreter._patch_lang, _SkipWhenPatched):
        return known
    fast = _SkipWhenPatched(interpreter._patch_lang)
    if not all(fast.names.values()):  # something was patched already: the names cannot be trusted
        return False
    interpreter._patch_lang = fast
    return True


def skip_overflow_checks() -> bool:
    """Turn off the interpreter's int32 overflow sanitizer; returns whether it was off or turned off."""
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or not hasattr(options, "sanitize_overflow"):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True
