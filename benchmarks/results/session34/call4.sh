# Session 34, call 4. (a) Call 1's dense run ran out of memory at SwiGLU T=4096 H=4096 (28.9 GiB in private
# pools: torch's make_graphed_callables copies, freed only by a collection); sizes now collects after each
# graphed baseline and width and reports what a cell leaves allocated: SwiGLU at H=4096, every T. (b) Mixtral
# at T=16384 (call 1's MoE run timed out before its skewed cell). (c) The picked-row tests (int64 rows), call
# 3 timed out at 90 s after 10 passed. (d) tests/test_compile.py's GPU tests (owed since session 33).
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part dense --acts swiglu --H 4096 --out $OUT/sizes_dense_h4096 > $OUT/sizes_dense_h4096.log 2>&1
echo "sizes dense swiglu H=4096 rc=$? ($((SECONDS - S)) s)"; grep -A4 "^cell" $OUT/sizes_dense_h4096.log | cut -c1-250
python3 -c "import json; [print(r['act'], r['T'], r['H'], 'allocated after the cell', round(r['cuda_allocated_mb']), 'MiB') for r in json.load(open('$OUT/sizes_dense_h4096.json'))['rows']]"; S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part moe --shapes mixtral --T 16384 --rounds 2 --reps 10 --out $OUT/sizes_mixtral16k > $OUT/sizes_mixtral16k.log 2>&1
echo "sizes mixtral 16384 rc=$? ($((SECONDS - S)) s)"; grep -A3 "^cell" $OUT/sizes_mixtral16k.log | cut -c1-330; S=$SECONDS
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/quant/test_quantize.py -k picked_rows > $OUT/picked_rows.log 2>&1
echo "picked-row tests rc=$? ($((SECONDS - S)) s)"; tail -2 $OUT/picked_rows.log; S=$SECONDS
timeout -s INT -k 20 120 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_compile.py -m gpu > $OUT/compile_gpu.log 2>&1
echo "test_compile -m gpu rc=$? ($((SECONDS - S)) s)"; tail -3 $OUT/compile_gpu.log
