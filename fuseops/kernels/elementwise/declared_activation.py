"""An elementwise activation declared by its user: a Triton element function and a torch reference.

The element function takes a float32 tile ``x`` and returns ``(f(x), f'(x))``; every kernel that
applies an activation (the elementwise kernels and the GEMM epilogues, forward and dgrad) receives
it as its ``ACT`` constexpr and calls it where it would branch on a shipped activation's code.
The torch reference gives the unfused path and the float64 oracle; its derivative comes from
``reference_grad`` when given, else from forward-mode differentiation of the reference.

Each declaration gets an int code from 64 up, so that the custom ops torch.compile sees carry it
as an int, as they carry a shipped ``Activation``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

# Below it: the shipped ``Activation`` codes (activation_math.py).
FIRST_CODE = 64

_declared: list[DeclaredActivation] = []
_lock = threading.Lock()


def is_element_function(fn: object) -> bool:
    """Whether ``fn`` is a ``@triton.jit`` function (compiled, or the interpreter's wrapper)."""
    from triton.runtime.jit import JITFunction

    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - every supported triton has it
        InterpretedFunction = JITFunction
    return isinstance(fn, (JITFunction, InterpretedFunction))


@dataclass(frozen=True, eq=False)
class DeclaredActivation:
    """``y = f(x)`` elementwise, with ``f'``. Compared by identity: one declaration, one code."""

    name: str
    # ``@triton.jit`` ``(x: float32 tile) -> (f(x), f'(x))``.
    kernel: object
    # ``f`` in torch, for any float dtype (float64 for the oracle).
    reference: Callable[[torch.Tensor], torch.Tensor]
    # ``f'`` in torch; None: ``reference``'s forward-mode derivative.
    reference_grad: Callable[[torch.Tensor], torch.Tensor] | None = None
    code: int = field(default=-1)

    def __int__(self) -> int:
        return self.code

    def __repr__(self) -> str:
        return f"DeclaredActivation({self.name!r})"

    def grad(self, x: torch.Tensor) -> torch.Tensor:
        """``f'(x)`` in torch."""
        if self.reference_grad is not None:
            return self.reference_grad(x)
        # f' of an elementwise f is its forward-mode derivative along ones; torch.func.jvp also
        # traces under torch.compile, where a backward's autograd.grad does not.
        return torch.func.jvp(self.reference, (x,), (torch.ones_like(x),))[1]


def declare(name: str, kernel: object, reference: Callable, reference_grad: Callable | None) -> DeclaredActivation:
    """A new declaration with the next free code (callers validate the arguments)."""
    with _lock:
        decl = DeclaredActivation(name, kernel, reference, reference_grad, FIRST_CODE + len(_declared))
        _declared.append(decl)
    return decl


def declared(code: int) -> DeclaredActivation:
    """The declaration whose code is ``code``."""
    index = code - FIRST_CODE
    if not 0 <= index < len(_declared):
        raise ValueError(f"act: expected a shipped Activation or a declared activation's code, got {code}")
    return _declared[index]
