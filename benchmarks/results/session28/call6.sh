# Session 28, device call 6: A/B of our custom operators with and without recorded programs, one
# machine, compiled MoE at T=1024.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 300 python3 benchmarks/results/session28/op_programs_ab.py > $OUT/op_programs_ab.log 2>&1
echo "op_programs_ab rc=$? ($((SECONDS - S)) s)"; grep -v "Warn\|warn" $OUT/op_programs_ab.log | cut -c1-700 | head -60
