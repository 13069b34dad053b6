"""Session 20: session 19's compiled_gap.py (compiled fuseops against torch.compile of the same
dense stack: step time, host time, Dynamo's cache lookup per step) with the fuseops package taken
from FUSEOPS_ROOT, so that two versions compare on one machine:
    python benchmarks/results/session20/compiled_gap.py 1024,1024 4096,1024                # this tree
    FUSEOPS_ROOT=build/base python benchmarks/results/session20/compiled_gap.py 1024,1024   # another
"""
import os
import runpy
import sys

sys.path.insert(0, os.environ.get("FUSEOPS_ROOT", "."))
# Imported now, so the "." that compiled_gap.py puts first cannot swap the package.
import fuseops

print(f"fuseops from {fuseops.__file__}", flush=True)
sys.path.insert(1, ".")
runpy.run_path("benchmarks/results/session19/compiled_gap.py", run_name="__main__")
