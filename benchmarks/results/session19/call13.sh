# Session 19, device call 13: after the dispatch-key change (fewer guards under compile), the
# compiled dense stack against torch.compile again (call 4 ran before it), and the offload GPU
# tests after the saved-handle refactor.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 120 python3 benchmarks/results/session19/compiled_gap.py 1024,1024 4096,1024 2>&1 | grep "^T="
timeout -s INT -k 10 $((230 - (SECONDS - S))) python3 -m pytest -p no:cacheprovider -q -rfE --tb=short -m gpu tests/offload > $OUT/tests_offload.log 2>&1
echo "offload gpu tests rc=$? ($((SECONDS - S)) s)"; grep -E "^(FAILED|ERROR)" $OUT/tests_offload.log | cut -c1-220; tail -1 $OUT/tests_offload.log
