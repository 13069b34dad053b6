# Session 53, device call 3: GPU tests of the host-path trims (the executor): the graphs part, then the top-level
# tests (test_compile, test_compiled_sequential, ... on the device's torch 2.11).
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=240 OUT=$OUT bash benchmarks/run_gpu.sh graphs | tail -4
LIMIT=270 OUT=$OUT bash benchmarks/run_gpu.sh top | tail -4
