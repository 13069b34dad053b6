# Session 43, call 1 ran benchmarks/results/session42/next_device_call.sh as it stands, with branch moe-eager-replay
# merged into the working tree: bash benchmarks/results/session42/next_device_call.sh
