#!/usr/bin/env bash
# Session 68's parts (the *.sh files here), run through session 55's calls.sh (a tar of each part's logs in $OUT);
# other names fall back to session 67's parts. README.md here.
export PYTHONPATH=. PYTHONUNBUFFERED=1
for part in "$@"; do
  if [[ -f benchmarks/results/session68/$part.sh ]]; then PARTS_DIR=benchmarks/results/session68 bash benchmarks/results/session55/calls.sh "$part"
  else bash benchmarks/results/session67/calls.sh "$part"; fi
done
