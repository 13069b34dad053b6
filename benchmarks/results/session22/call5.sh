# Session 22, device call 5: recorded plan runs with direct launches (a launch whose specialization the
# layout fixes calls its stored C entry point, no key), torch's own Python bindings for aten ops where a
# meta probe shows they dispatch the same overload, and no replayed detach after allocations. Bitwise
# check and the interleaved step / enqueue A/B, the programs and a profile, then the ops part of the
# GPU suite (tests/moe, tests/ops) in what time is left.
export PYTHONPATH=. PYTHONUNBUFFERED=1
S=$SECONDS
timeout 200 python3 benchmarks/results/session22/replay_ab.py --reps 20 --rounds 3 > $OUT/replay_ab.log 2>&1
echo "replay_ab rc=$? ($((SECONDS - S)) s)"; grep -v Warning $OUT/replay_ab.log | grep -v "return torch" | tail -20 | cut -c1-200
timeout 100 python3 benchmarks/results/session22/replay_profile.py --steps 200 --cells gelu moe --top 20 > $OUT/replay_profile.log 2>&1
echo "profile rc=$? ($((SECONDS - S)) s)"; grep -E "^== |replays in" $OUT/replay_profile.log | head
LIMIT=$((585 - (SECONDS - S))) bash benchmarks/run_gpu.sh ops
