# Session 42, call 4: (a) the gpu-marked graph / replay tests and the launch tests with descriptors without metadata
# expanded from the base too; (b) the descriptor A/B with step times at GELU H=4096 T=1024 (call 3's table: 0.94x,
# 1.04x in session 40) and T=4096; (c) the H=4096 rows of issue 20's dense table again, 3 rounds. ~7 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
LIMIT=130 bash benchmarks/run_gpu.sh graphs 2>&1 | tail -3
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_launch.py tests/kernels/test_launch_descriptors.py 2>&1 | tail -1
S=$SECONDS
timeout 150 python3 benchmarks/results/session42/descriptor_ab.py --cells gelu:1024:4096 gelu:4096:4096 --rounds 4 > $OUT/call4_descriptor_ab.log 2>&1
echo "descriptor_ab rc=$? ($((SECONDS - S)) s)"; grep "drained\|step ms" $OUT/call4_descriptor_ab.log | cut -c1-250
S=$SECONDS
timeout 260 python3 -m benchmarks.sizes --part dense --H 4096 --rounds 3 --out $OUT/call4_sizes_dense_h4096 > $OUT/call4_sizes_dense_h4096.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A8 "^cell" $OUT/call4_sizes_dense_h4096.log | cut -c1-250
