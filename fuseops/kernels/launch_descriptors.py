"""Host tensor descriptors of a fast launch, their expansion kept between calls.

Triton 3.6's NVIDIA launcher (``CudaLauncher.launch``) is ``wrap_handle_tensordesc``'s
``inner`` around the C launcher when a kernel takes descriptors: per call and per descriptor
it runs ``make_tensordesc_arg``, which on Hopper encodes a new ``CUtensorMap``
(``fill_tma_descriptor``: ``cuTensorMapEncodeTiled`` behind a Python call, a few
microseconds each, four to six per dense GEMM). ``make_tensordesc_arg`` reads of the
descriptor only ``base.data_ptr()``, ``shape``, ``strides`` and ``padding``, the rest comes
from the compiled kernel's metadata for that descriptor; the map it returns is only read
(the C launcher copies it by value into the kernel's parameters). So its result for an
equal (address, shape, strides, padding) at the same descriptor position of the same
compiled kernel is the same, and ``DescriptorLaunch`` keeps it: a training step's weights
and most activations (the caching allocator hands back the same blocks) hit.

Kept only where the metadata is not None (TMA lowered: the expansion is the map, the shape
and the strides, no tensor held); otherwise, and when a key is not hashable, the expansion
is Triton's, per call. ``verify`` (``CHECK``) makes every hit also encode the map afresh and
compare it (``ExpansionMismatch`` otherwise): shape and strides by value, the map byte for
byte where two fresh encodings agree on their bytes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

# Entries kept per descriptor position (about 600 bytes each: the 256-byte map object, its
# list and key); past it the position's dict is cleared. A model whose layers hand one
# position more distinct (address, shape) pairs a step than this pays Triton's encoding.
MAX_MAPS_PER_DESCRIPTOR = 1024
# Arguments of the C launcher before the kernel's own (driver.py's _BASE_ARGS_FORMAT).
_BASE_ARGS = 13
# A CUtensorMap is 128 bytes, the last member of PyCUtensorMapObject (128-byte aligned).
_MAP_BYTES = 128


class ExpansionMismatch(AssertionError):
    """A kept descriptor expansion differs from a fresh one (``verify`` found it)."""


def descriptor_launch(launch: Any) -> Any:
    """``launch`` (a CudaLauncher's ``launch``) as a ``DescriptorLaunch`` when it is Triton's
    descriptor-expanding wrapper, else ``launch`` itself."""
    code = getattr(launch, "__code__", None)
    if (code is None or getattr(launch, "__module__", None) != "triton.backends.nvidia.driver"
            or getattr(launch, "__qualname__", None) != "wrap_handle_tensordesc.<locals>.inner"):
        return launch
    cells = dict(zip(code.co_freevars, launch.__closure__ or ()))
    try:
        raw = cells["launcher"].cell_contents
        indices = cells["tensordesc_indices"].cell_contents
        metas = cells["tensordesc_meta"].cell_contents
    except (KeyError, ValueError):
        return launch
    from triton.backends.nvidia import driver
    return DescriptorLaunch(raw, sorted(indices), list(metas), driver.make_tensordesc_arg)


class DescriptorLaunch:
    """Triton's ``inner``: the C launcher ``raw`` called with each descriptor (at argument
    ``positions`` after the launcher's own) expanded, by ``make_arg(desc, meta)`` or from
    the expansions kept per position (module docstring)."""

    __slots__ = ("indices", "raw", "positions", "metas", "kept", "make_arg", "verify")

    def __init__(self, raw, positions: list[int], metas: list, make_arg):
        assert len(positions) == len(metas)
        self.raw = raw
        # The descriptors' places among the kernel's arguments, and among the launcher's.
        self.indices = tuple(positions)
        self.positions = tuple(_BASE_ARGS + i for i in positions)
        self.metas = metas
        self.kept: list[dict | None] = [None if m is None else {} for m in metas]
        self.make_arg = make_arg
        self.verify = False

    def __call__(self, *args):
        out = list(args[:self.positions[0]])
        start = 0
        for j, pos in enumerate(self.positions):
            if start:
                out += args[start:pos]
            out += self.expand(j, args[pos])
            start = pos + 1
        out += args[start:]
        return self.raw(*out)

    def expand(self, j: int, desc) -> list:
        kept = self.kept[j]
        if kept is None:
            return self.make_arg(desc, self.metas[j])
        try:
            key = (desc.base.data_ptr(), desc.shape, desc.strides, desc.padding)
            hit = kept.get(key)
        except TypeError:  # a list shape or strides: not hashable
            return self.make_arg(desc, self.metas[j])
        if hit is None:
            hit = self.make_arg(desc, self.metas[j])
            if len(kept) >= MAX_MAPS_PER_DESCRIPTOR:
                kept.clear()
            kept[key] = hit
        elif self.verify:
            self.compare(hit, desc, self.metas[j])
        return hit

    def expansion(self, j: int, desc) -> Callable[[Any], list] | None:
        """What ``expand(j, d)`` gives for a descriptor ``d`` with ``desc``'s shape, strides and
        padding over a tensor ``t``, as a function of ``t`` (kept and verified as ``expand``
        keeps and verifies). Without metadata (a descriptor the kernel does not lower to TMA:
        one its constexprs leave unused) the expansion is the base itself followed by values of
        the shape, strides and padding alone, made once. None where ``desc``'s key is not
        hashable, or an expansion without metadata is not of that form: the caller then
        passes descriptors."""
        kept = self.kept[j]
        shape, strides, padding = desc.shape, desc.strides, desc.padding
        try:
            hash((shape, strides, padding))
        except TypeError:
            return None
        meta, make_arg = self.metas[j], self.make_arg
        if kept is None:
            first, *rest = make_arg(_Over(desc.base, shape, strides, padding), meta)
            if first is not desc.base or any(not isinstance(v, (int, bool)) for v in rest):
                return None
            return lambda t: [t, *rest]

        def expanded(t) -> list:
            key = (t.data_ptr(), shape, strides, padding)
            hit = kept.get(key)
            if hit is None:
                hit = make_arg(_Over(t, shape, strides, padding), meta)
                if len(kept) >= MAX_MAPS_PER_DESCRIPTOR:
                    kept.clear()
                kept[key] = hit
            elif self.verify:
                self.compare(hit, _Over(t, shape, strides, padding), meta)
            return hit
        return expanded

    def compare(self, kept: list, desc, meta):
        """Raise if ``kept`` is not what encoding ``desc`` afresh gives. The map's bytes are
        compared only where two fresh encodings agree on them: the driver documents no
        zeroing of the map's unused bytes (the object's memory comes uninitialized)."""
        fresh = self.make_arg(desc, meta)
        if len(kept) != len(fresh) or kept[1:] != fresh[1:]:
            raise ExpansionMismatch(f"kept descriptor expansion {kept[1:]} differs from a fresh one {fresh[1:]}")
        if map_bytes(kept[0]) != map_bytes(fresh[0]) and map_bytes(fresh[0]) == map_bytes(self.make_arg(desc, meta)[0]):
            raise ExpansionMismatch(f"kept CUtensorMap for {fresh[1:]} differs from a fresh one")


class _Over:
    """What ``make_tensordesc_arg`` reads of a descriptor: its base, shape, strides, padding."""

    __slots__ = ("base", "padding", "shape", "strides")

    def __init__(self, base, shape, strides, padding) -> None:
        self.base, self.shape, self.strides, self.padding = base, shape, strides, padding


def map_bytes(tensor_map) -> bytes:
    """The 128 bytes of a PyCUtensorMap's CUtensorMap (the object's last, aligned member)."""
    return ctypes.string_at(id(tensor_map) + type(tensor_map).__basicsize__ - _MAP_BYTES, _MAP_BYTES)
