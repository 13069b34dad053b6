# Prepared in session 49 for the next device session. One call each:
#   git checkout driver-first; bash benchmarks/results/session49/next_device_calls.sh driver_first   # ~6 min
#     the branch resolves Triton's driver before a process's first launch (launch.direct_state), so the first
#     program of a fresh process records at its second call like the others (run 12's churn log: the stack's
#     first forward a step late, its seven consumers captured again under FUSEOPS_CUDA_GRAPHS=all). Expect: the new
#     GPU test passes; first_program_probe shows eight programs recorded at step 1; fresh processes under `all`
#     capture eight programs (no recaptures) at about the default rule's peak reserved memory; the graphs part and
#     the launch GPU tests pass. Then merge the branch.
#   bash benchmarks/results/session49/next_device_calls.sh sizes_all   # ~9 min: the dense sizes at H=4096 (GPU-bound
#     cells) at the default rule and under `all` (issue 20's busy host at GPU-bound cells; then the MoE cells likewise)
#   bash benchmarks/results/session49/next_device_calls.sh users       # ~6 min, owed by session 49's hot-path change
#     (graphed.py's keep rule, graph memory, the wait): where users start, the sizes at T=1024 (eager and compiled)
#     and float32 weights under autocast
#   bash benchmarks/results/session46/next_device_calls.sh suite       # the CUDA edge cases' Backward subjects
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-}" in
  driver_first)
    timeout 200 python3 -m pytest -p no:cacheprovider -q -m gpu tests/ops/executor/test_replay.py tests/kernels/test_launch.py 2>&1 | tail -3
    timeout 60 python3 benchmarks/results/session49/first_program_probe.py > $OUT/first_program.log 2>&1; echo "probe rc=$?"
    grep -E "keep|^--" $OUT/first_program.log | cut -c1-160
    for c in gelu:4096:4096 swiglu:4096:4096; do
      echo "$(timeout 60 python3 benchmarks/results/session49/fresh_ab.py wait $c 2>&1 | tail -1 | cut -c1-190)"
    done
    LIMIT=200 bash benchmarks/run_gpu.sh graphs ;;
  sizes_all)
    timeout 280 python3 -m benchmarks.sizes --part dense --H 4096 --T 4096 16384 --rounds 2 --out $OUT/sizes_dense_4096 \
      > $OUT/sizes_dense_4096.log 2>&1; echo "default rc=$?"; tail -6 $OUT/sizes_dense_4096.log | cut -c1-220
    FUSEOPS_CUDA_GRAPHS=all timeout 280 python3 -m benchmarks.sizes --part dense --H 4096 --T 4096 16384 --rounds 2 \
      --out $OUT/sizes_dense_4096_all > $OUT/sizes_dense_4096_all.log 2>&1; echo "all rc=$?"
    tail -6 $OUT/sizes_dense_4096_all.log | cut -c1-220 ;;
  users)
    timeout 330 python3 -m benchmarks.sizes --part dense --T 1024 --H 1024 2048 --rounds 2 --out $OUT/sizes_T1024 \
      > $OUT/sizes_T1024.log 2>&1; echo "sizes rc=$?"; tail -8 $OUT/sizes_T1024.log | cut -c1-220
    timeout 150 python3 -m benchmarks.autocast --T 1024 > $OUT/autocast.log 2>&1; echo "autocast rc=$?"
    tail -5 $OUT/autocast.log | cut -c1-200 ;;
  *) echo "usage: $0 driver_first|sizes_all|users" ;;
esac
