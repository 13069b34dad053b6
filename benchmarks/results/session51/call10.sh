# Session 51, run 10: test_gpu_compiled_steps_are_the_eager_steps_and_replay_graphs[dense] failed in the top part
# (runs 8, 9) and its steps replayed standalone (run 9's probe): which mode and which order fail.
export PYTHONPATH=. PYTHONUNBUFFERED=1
t=tests/test_compiled_sequential.py
for mode in 1 host; do
  FUSEOPS_CUDA_GRAPHS=$mode timeout 150 python3 -m pytest -p no:cacheprovider -q -x $t > $OUT/file_$mode.log 2>&1
  echo "file mode=$mode rc=$? $(tail -1 $OUT/file_$mode.log)"
done
FUSEOPS_CUDA_GRAPHS=1 timeout 100 python3 -m pytest -p no:cacheprovider -q $t -k replay_graphs > $OUT/alone.log 2>&1
echo "alone mode=1 rc=$? $(tail -1 $OUT/alone.log)"
