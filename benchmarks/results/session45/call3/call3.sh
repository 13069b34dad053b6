# Session 45 call 3: GPU parts not run since the compiled Sequential's changes (sessions 44-45): `hopper` whole
# (hopper/test_wgrad.py's dense tests never ran in session 44), then `fp8layer`, as far as the call goes.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=330 bash benchmarks/run_gpu.sh hopper 2>&1 | tail -3
LIMIT=$((575 - SECONDS)) bash benchmarks/run_gpu.sh fp8layer 2>&1 | tail -3
