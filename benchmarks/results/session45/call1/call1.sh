# Session 45 call 1 ran session 44's prepared script, on branch compiled-check-memo:
bash benchmarks/results/session44/check_memo_call.sh
