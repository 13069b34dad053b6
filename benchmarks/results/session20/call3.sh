# Session 20, device call 3: which part of _ExpertLayer makes torch 2.11's Dynamo drop its gradient
# (compile_variants.py), then the top part's remainder past tests/quant/test_quantize.py.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 150 python3 benchmarks/results/session20/compile_variants.py > $OUT/variants.log 2>&1
echo "variants rc=$? ($((SECONDS - S)) s)"; grep -v Warn $OUT/variants.log | grep -E "^[A-Za-z0-9 .]+ (eager|aot_eager)|^2\." | cut -c1-250
q="python3 -m pytest -p no:cacheprovider -q -rfE --tb=short"
timeout -s INT -k 10 $((560 - (SECONDS - S))) $q tests/test_compile.py tests/test_bad_input.py tests/test_call_cache.py tests/test_fuser.py tests/test_sequential.py tests/test_torch_nn_behaviour.py tests/quant/test_recipes.py tests/quant/test_weight_cache.py tests/quant/test_custom_ops.py tests/quant/test_emit.py > $OUT/top_rest.log 2>&1
echo "top rest rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/top_rest.log | cut -c1-200; tail -1 $OUT/top_rest.log
