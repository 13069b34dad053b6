# Session 51, run 9: why the compiled dense test saw no forward replay under the default; the mended
# GPU test of the default; the top part (session 51 run 8 reached 71 % in 200 s).
export PYTHONPATH=. PYTHONUNBUFFERED=1
for mode in host 1; do
  FUSEOPS_CUDA_GRAPHS=$mode timeout 120 python3 benchmarks/results/session51/compiled_probe.py dense 2>&1 \
    | grep -v Warning | tail -14 | cut -c1-300 | tee -a $OUT/probe.txt
done
timeout 150 python3 -m pytest -p no:cacheprovider -q -m gpu tests/ops/executor/test_graphed.py \
  -k "default_graphs" > $OUT/graphed_test.log 2>&1; echo "graphed test rc=$?"; tail -1 $OUT/graphed_test.log
LIMIT=330 bash benchmarks/run_gpu.sh top
