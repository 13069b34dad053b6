# Session 28, device call 2: the autocast routing-graph GPU tests again (call 1: the test passed a
# torch.device to torch.autocast); the FP8 MoE step's synchronisation; the compiled step's host time
# by launcher, and stubbed.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout -s INT -k 10 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/moe/test_routing_graphs.py -k autocast > $OUT/autocast_tests.log 2>&1
echo "autocast tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/autocast_tests.log | cut -c1-250 | head -12; tail -1 $OUT/autocast_tests.log; S=$SECONDS
timeout 120 python3 benchmarks/results/session28/sync_hunt.py > $OUT/sync_hunt.log 2>&1
echo "sync_hunt rc=$? ($((SECONDS - S)) s)"; grep -v "^\s*$" $OUT/sync_hunt.log | cut -c1-220 | tail -40; S=$SECONDS
timeout 300 python3 benchmarks/results/session28/compiled_host.py > $OUT/compiled_host.log 2>&1
echo "compiled_host rc=$? ($((SECONDS - S)) s)"; grep -A20 "^| cell" $OUT/compiled_host.log | cut -c1-400; tail -3 $OUT/compiled_host.log | cut -c1-300
