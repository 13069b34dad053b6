"""Session 19: localise session 18's compiled FP8 faults on CUDA. The dispatcher now refuses to
trace quantized kernels for GPU work; this lifts the refusal (as before commit b62c083) and runs
session 18's checks, so that aot_eager (the traced graph, no inductor code) and inductor can be
told apart. Extra: LOCALISE=1 compiles the layer once per quantized kernel left traced (the
others refused, so they run eagerly): which traced reference gives the wrong gradient.
    python benchmarks/results/session19/forced_trace.py compile blockwise 256
Ran in call 1 at commit a30dba9; the refusal it lifts was removed later in session 19 (the
quantized kernels became custom ops), so at later commits it no longer changes anything.
"""
import os
import sys

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks/results/session18")
from fuseops.kernels import dispatch

only = os.environ.get("TRACE_ONLY")
if only:
    # Refuse every quantized kernel but the named one (launcher reads QUANTIZED at each call).
    dispatch.QUANTIZED = frozenset(k for k in dispatch.QUANTIZED if k.value != only)
else:
    dispatch.refuses_traced_quantized = lambda t: False

import fp8_user_checks

fp8_user_checks.main()
