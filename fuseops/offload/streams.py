"""The current CUDA stream, looked up at the cost of one call into torch; a stream made
current for a few copies without ``torch.cuda.stream``'s context object.

``torch.cuda.current_stream`` builds a new ``Stream`` object on every call (argument
checks, lazy-init check, the object itself), and the offload link and timer ask for the
current stream several times per group and once per reloaded tensor unpacked. Here the
raw lookup (stream id, device index, device type) picks a ``Stream`` object built once
per stream: the same stream as ``torch.cuda.current_stream`` gives, so waits, records
and comparisons are unchanged. ``CopyStream`` switches to a copy stream and back as
``torch.cuda.stream`` does when the stream is on the current device (it builds two
``Stream`` objects and compares their devices on each use), and defers to it otherwise.
"""

from __future__ import annotations

import torch

# The raw lookup ``torch.cuda.current_stream`` itself calls (absent from CPU-only builds,
# where nothing here runs on a real device).
_raw_current = getattr(torch._C, "_cuda_getCurrentStream", None)
_torch_current_stream = torch.cuda.current_stream
_by_key: dict[tuple[int, int, int], torch.cuda.Stream] = {}
# Streams of a process are few (the default, pool streams, a user's own); a program that
# creates streams without end only rebuilds its cache now and then.
MAX_STREAMS = 256


def current_stream(device: torch.device) -> torch.cuda.Stream:
    """``torch.cuda.current_stream(device)``, for a CUDA ``device``."""
    if (_raw_current is None or device.index is None or torch.cuda.current_stream is not _torch_current_stream
            or not torch.cuda.is_initialized()):
        # No raw lookup (a CPU-only build), no index, torch's function stands replaced (a
        # test's stand-in streams), or CUDA not yet initialised: asked as torch would be.
        return torch.cuda.current_stream(device)
    key = _raw_current(device.index)
    stream = _by_key.get(key)
    if stream is None:
        if len(_by_key) >= MAX_STREAMS:
            _by_key.clear()
        stream = _by_key[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return stream


class CopyStream:
    """``with CopyStream(stream, device):`` runs the block on ``stream`` of ``device``,
    as ``with torch.cuda.stream(stream):`` would."""

    __slots__ = ("_fallback", "_previous", "device", "stream")

    def __init__(self, stream: torch.cuda.Stream, device: torch.device) -> None:
        self.stream, self.device = stream, device
        self._previous = self._fallback = None

    def __enter__(self) -> None:
        if _raw_current is None or self.device.index is None or torch.cuda.current_device() != self.device.index:
            # Another device is current (or no raw lookup): torch's context handles both.
            self._fallback = torch.cuda.stream(self.stream)
            self._fallback.__enter__()
            return
        self._previous = current_stream(self.device)
        torch.cuda.set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        if self._fallback is not None:
            fallback, self._fallback = self._fallback, None
            fallback.__exit__(*exc)
            return
        previous, self._previous = self._previous, None
        torch.cuda.set_stream(previous)


def refuse_capture() -> None:
    """A RuntimeError inside a CUDA graph capture: what moves, and when, is decided on the host at
    every step (events read, copies queued), so a graph would replay one step's decisions and
    copies over another step's tensors."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("offload_activations: a CUDA graph is being captured; offloading decides on the "
                           "host at each step and cannot be captured. Capture without offloading, or nest "
                           "fuseops.offload_activations(enabled=False) around the captured region")
