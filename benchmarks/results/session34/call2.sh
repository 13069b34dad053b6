# Session 34, call 2 (prepared in session 33). (a) Session 33's MoE sizes run had OLMoE 0.98-1.23x against
# session 29's 1.18-1.41x, the layer's enqueue 1.7-2.0 ms against 0.95-1.1, and graph states staying eager 21
# times against 4; that run had Qwen3's cells (T=1024 and 4096) first. OLMoE alone at T=1024, then Qwen3 and
# OLMoE at T=1024 in one process, tell the graph states' decisions (timed, per state) from a regression.
# (b) The MoE GPU tests not run since session 31's trim of the routing graph states' call path.
# (c) After session 33's idle-key eviction in routing_graphs (the budget freed from states of shapes no longer
# called), the sizes benchmark also clears the states per shape: (a)'s second run then shows whether the order
# mattered; tests/moe/test_routing_graphs.py runs its GPU tests here too.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 120 python3 -m benchmarks.sizes --part moe --shapes olmoe --T 1024 --rounds 2 --reps 10 --out $OUT/olmoe_alone > $OUT/olmoe_alone.log 2>&1
echo "olmoe alone rc=$? ($((SECONDS - S)) s)"; grep -A4 "^cell" $OUT/olmoe_alone.log | cut -c1-330; S=$SECONDS
timeout 150 python3 -m benchmarks.sizes --part moe --shapes qwen3 olmoe --T 1024 --rounds 2 --reps 10 --out $OUT/qwen3_olmoe > $OUT/qwen3_olmoe.log 2>&1
echo "qwen3 then olmoe rc=$? ($((SECONDS - S)) s)"; grep -A6 "^cell" $OUT/qwen3_olmoe.log | cut -c1-330; S=$SECONDS
python3 -c "import json; [print(r['shape'], r['T'], r['routing'], 'routing graphs hold', round(r['routing_graphs_held_mb']), 'MiB') for r in json.load(open('$OUT/qwen3_olmoe.json'))['rows']]"
timeout -s INT -k 20 250 python3 -m pytest -q -p no:cacheprovider -rfE tests/moe/test_routing.py tests/moe/test_moe_layer.py \
  tests/moe/test_routing_ops.py tests/moe/test_routing_graphs.py > $OUT/moe_tests.log 2>&1
echo "moe tests rc=$? ($((SECONDS - S)) s)"; tail -3 $OUT/moe_tests.log
