# Session 22, device call 6: recorded plan runs after call 5: the recorder holds weak references (call 5's
# test_gpu_peak_memory_follows_the_byte_accounting failed: the recording call kept every intermediate
# alive), host reads through torch's Python wrappers refused too. The failing test; the CUDA property
# suite of the dense fusions (it now checks a replayed third call bit for bit); the A/B; the dense sizes
# cells that are host-bound (GELU, H=1024, T=1024 and 4096: fuseops eager and compiled, torch eager,
# compiled and graphed).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/moe/test_expert_layer.py -k "peak_memory" 2>&1 | grep -E "passed|failed|^E " | tail -4
LIMIT=200 bash benchmarks/run_gpu.sh props "ForwardLinearBiasAct or BackwardActBias or ForwardLinearAdd or GroupedMLP"
echo "tests ($((SECONDS - S)) s)"
timeout 150 python3 benchmarks/results/session22/replay_ab.py --reps 20 --rounds 3 > $OUT/replay_ab.log 2>&1
echo "replay_ab rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/replay_ab.log | grep -v "return torch" | tail -9 | cut -c1-200
timeout $((585 - (SECONDS - S))) python3 -m benchmarks.sizes --part dense --acts gelu --T 1024 4096 --H 1024 --out $OUT/sizes_dense > $OUT/sizes.log 2>&1
echo "sizes rc=$? ($((SECONDS - S)) s)"; tail -6 $OUT/sizes.log | cut -c1-250
