"""Where the benchmarks write their results: ``benchmarks/results/<name>-<gpu>-<date>.json`` (and
``.png``), one current file per benchmark and GPU. A new run writes a new file; the older file of
the same benchmark and GPU is deleted by hand when the new one replaces it."""

from __future__ import annotations

import datetime
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
# The one way every benchmark and every doc counts a step's peak memory; results files that count
# so say it in their "peak" key.
PEAK_CONVENTION = ("allocated above the start of a training step whose gradient buffers are allocated "
                   "inside it, as a first step's are")


def gpu_tag(device: str = "cuda") -> str:
    """A short name for the machine: "h100" for "NVIDIA H100 80GB HBM3", "h200" for "NVIDIA H200";
    "cpu" off the GPU."""
    if device != "cuda" or not torch.cuda.is_available():
        return "cpu"
    words = torch.cuda.get_device_name().replace("NVIDIA", " ").replace("-", " ").split()
    named = [w for w in words if any(c.isdigit() for c in w)]
    return (named or words or ["gpu"])[0].lower()


def results_path(name: str, suffix: str = ".json", device: str = "cuda", directory: Path = RESULTS) -> Path:
    """``directory / "<name>-<gpu>-<today>" + suffix``."""
    return directory / f"{name}-{gpu_tag(device)}-{datetime.date.today().isoformat()}{suffix}"


def pyplot():
    """matplotlib's ``pyplot`` on the Agg backend (files only, no display), or None with a printed
    note where matplotlib is not installed (the benchmark then writes no plot)."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed: no plot", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
