# Session 64: torch's CPU activation kernels at large / non-finite inputs on this host (per vector ISA), then the
# activation tests after the GELU(tanh) saturation fix (references and kernels), CPU and CUDA on torch 2.11.
lscpu | grep -E "Model name|Flags" | cut -c1-60
timeout 120 python3 benchmarks/results/session64/cpu_kernels_probe.py 2>&1 | cut -c1-400 | tee "$OUT_PART/probe.log"
timeout -s INT -k 20 ${SIDE_LIMIT:-300} python3 -m pytest -p no:cacheprovider -q -rfE --tb=short \
  tests/ops/test_activation.py tests/ops/test_gated.py tests/kernels/elementwise/test_activation.py \
  tests/kernels/elementwise/test_gated_activation.py > "$OUT_PART/refs2.log" 2>&1
echo "refs2 rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT_PART/refs2.log" | cut -c1-200; tail -1 "$OUT_PART/refs2.log"
