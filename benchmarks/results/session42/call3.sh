# Session 42, call 3: (a) A/B on one machine of recorded programs passing descriptors as kept expansions (on) against
# rebuilding descriptor objects every launch (off), drained issue time beside torch eager (descriptor_ab.py);
# (b) issue 20's dense table, every cell, with the change. ~8 min.
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 200 python3 benchmarks/results/session42/descriptor_ab.py --cells gelu:16384:4096 gelu:4096:4096 swiglu:16384:1024 gelu:16384:1024 > $OUT/call3_descriptor_ab.log 2>&1
echo "descriptor_ab rc=$? ($((SECONDS - S)) s)"; grep "drained" $OUT/call3_descriptor_ab.log | cut -c1-250
S=$SECONDS
timeout 320 python3 -m benchmarks.sizes --part dense --out $OUT/call3_sizes_dense > $OUT/call3_sizes_dense.log 2>&1
echo "sizes dense rc=$? ($((SECONDS - S)) s)"; grep -A20 "^cell" $OUT/call3_sizes_dense.log | cut -c1-250
