"""The current CUDA stream, looked up at the cost of one call into torch.

``torch.cuda.current_stream`` builds a new ``Stream`` object on every call (argument
checks, lazy-init check, the object itself), and the offload link and timer ask for the
current stream several times per group and once per reloaded tensor unpacked. Here the
raw lookup (stream id, device index, device type) picks a ``Stream`` object built once
per stream: the same stream as ``torch.cuda.current_stream`` gives, so waits, records
and comparisons are unchanged.
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
    if _raw_current is None or device.index is None or torch.cuda.current_stream is not _torch_current_stream:
        # No raw lookup (a CPU-only build), no index, or torch's function stands replaced
        # (a test's stand-in streams): asked as torch would be.
        return torch.cuda.current_stream(device)
    key = _raw_current(device.index)
    stream = _by_key.get(key)
    if stream is None:
        if len(_by_key) >= MAX_STREAMS:
            _by_key.clear()
        stream = _by_key[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return stream
