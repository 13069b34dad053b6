# Session 40, call 1 (prepared in session 39): the elementwise kernels whose GPU tiles were never timed, swept as
# session 39's norm backward was (1.24-1.78x there): the GELU backward + dbias, the column sums, the RMSNorm
# forward, at the dense stack's shapes, against the library's tile and torch's ops. ~4 min. Adopt a tile only
# where it wins at every shape of its kind (or add a rule by size), check ptxas offline for spills
# (`sm90_report`); LayerNorm's backward swept too (session 39 swept RMSNorm only; 64 values a thread
# were faster at 1,024 columns but LayerNorm spills sooner). Then run the kernels' GPU tests and the dense cells (`sizes --part dense`).
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
S=$SECONDS
timeout 500 python3 benchmarks/results/session40/elementwise_sweep.py > $OUT/elementwise_sweep.log 2>&1
echo "sweep rc=$? ($((SECONDS - S)) s)"; grep -E "^[A-Z]|x  " $OUT/elementwise_sweep.log | cut -c1-140 | head -70
S=$SECONDS
timeout 120 python3 benchmarks/results/session39/norm_sweep.py --layernorm > $OUT/norm_sweep_layernorm.log 2>&1
echo "layernorm sweep rc=$? ($((SECONDS - S)) s)"; grep -E "library|x  block" $OUT/norm_sweep_layernorm.log | cut -c1-140 | head -42
