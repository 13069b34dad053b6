# Session 52, device call 2: where the GPU idles in a compiled fuseops step at GELU T=1024 H=4096 (session 51: 6.25
# against fuseops eager's 5.42 ms, with about the same kernels: run 1), then session 51's `tests` part.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for v in "" "--compiled" "--torch --compiled" "--torch"; do
  name=gaps$(echo "$v" | tr -d ' -')
  timeout 100 python3 -m benchmarks.step_gaps --model dense --cell gelu:1024:4096 --warmup 40 --steps 10 $v \
    --out $OUT/$name.json > $OUT/$name.log 2>&1; echo "$name rc=$?"; head -4 $OUT/$name.log | cut -c1-200
done
bash benchmarks/results/session51/next_device_calls.sh tests
