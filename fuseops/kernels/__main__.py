"""``python -m fuseops.kernels``: print the dispatch table."""

from fuseops.kernels.dispatch import describe

print(describe())
