"""fuseops: PyTorch models composed from basic ops, fused by a planner into Triton kernels.

``fuseops.__version__`` is the installed distribution's version (the pyproject's when run
from a source tree). Logging goes to the ``"fuseops"`` logger: each plan built and the
fusions it declined at DEBUG, fallbacks (a fusion declined because an op has hooks) once at
WARNING.
"""

import logging

from fuseops import distributed, integrations, moe, ops
from fuseops.exported_names import exported_dir
from fuseops.offload import mark_not_offload, offload_activations
from fuseops.quant import recipes, weight_cache
from fuseops.quant.autocast import autocast
from fuseops.quant.quantize import quantize
from fuseops.sequential import Sequential


def _version() -> str:
    from importlib import metadata
    from pathlib import Path

    try:
        return metadata.version("fuseops")
    except metadata.PackageNotFoundError:
        import re

        # A source tree: the pyproject's ``version = "..."`` (tomllib needs Python 3.11).
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
        return found.group(1) if found else "0+unknown"


__version__ = _version()
logging.getLogger("fuseops").addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "Sequential",
    "autocast",
    "distributed",
    "integrations",
    "mark_not_offload",
    "moe",
    "offload_activations",
    "ops",
    "quantize",
    "recipes",
    "weight_cache",
]


def __dir__() -> list[str]:
    return exported_dir(globals(), __all__)
