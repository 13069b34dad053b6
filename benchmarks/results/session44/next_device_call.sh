# Prepared in session 44 for the next device session (did not run there: too little device time was left for a
# machine start): the CUDA edge cases of the elementwise subjects, as far as 300 s go; the CUDA property suite ran
# complete in session 44 (calls 4-7), the `kernels` part in calls 1 and 3 (but hopper/test_wgrad.py's dense tests).
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=300 bash benchmarks/run_gpu.sh edge "GELU or SiLU or ReLU or SReLU or Sigmoid or Identity or Bias or SwiGLU or GeGLU or ReGLU" 2>&1 | tail -3
