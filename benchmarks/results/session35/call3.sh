# Session 35, call 3 (prepared in session 34): issue 20's MoE cells at T=16384 (session 34's call 1 ran out of
# its limit before Mixtral's skewed cell; call 4 ran Mixtral alone), then the CUDA edge case owed since session
# 31 (ForwardQuantizedGroupedMLP non_finite: ~190 s on a fresh machine; one_row passed in session 34), then
# benchmarks.autocast (below; the three may pass the 10-minute call: run it alone if the first two are long).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 240 python3 -m benchmarks.sizes --part moe --T 16384 --rounds 2 --reps 10 --out $OUT/sizes_moe16k > $OUT/sizes_moe16k.log 2>&1
echo "sizes moe 16384 rc=$? ($((SECONDS - S)) s)"; grep -A10 "^cell" $OUT/sizes_moe16k.log | cut -c1-330; S=$SECONDS
LIMIT=200 OUT=$OUT bash benchmarks/run_gpu.sh edge "ForwardQuantizedGroupedMLP and non_finite" | tail -3
# (d) Float32 weights under torch.autocast at T=1024 (the rules' check of a changed hot path; not run on the
# final code of session 34).
S=$SECONDS
timeout 120 python3 -m benchmarks.autocast --T 1024 --rounds 2 --out $OUT/autocast.json > $OUT/autocast.log 2>&1
echo "autocast rc=$? ($((SECONDS - S)) s)"; tail -12 $OUT/autocast.log | cut -c1-200
