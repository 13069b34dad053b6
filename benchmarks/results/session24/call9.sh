# Session 24, device call 9: graph states and the host profile with graphs v2 (graph_states.py; output in the transcript only: 4 forwards graphed, 3 of 4 backwards eager after saved inputs moved).
python3 benchmarks/results/session24/graph_states.py
