# Session 19, device call 9 (issue 23): A/B of the offload host trims on one machine, moe stack:
# the scheduler before them (base_offload/, fuseops/offload at 3fc6e5b, in a copy of the tree)
# against the merged one, alternating, each the benchmark's curve and 4 interleaved rounds.
export PYTHONUNBUFFERED=1
# base_offload/ (not kept): `git archive 3fc6e5b fuseops/offload | tar -x -C /tmp`, its files copied there.
rm -rf /tmp/base && mkdir /tmp/base && cp -r $(ls -A | grep -v "^.git$") /tmp/base/ && rm -rf /tmp/base/fuseops/offload \
  && cp -r benchmarks/results/session19/base_offload /tmp/base/fuseops/offload
here=$PWD
for r in 1 2; do
  for v in base new; do
    d=$here; [ $v = base ] && d=/tmp/base
    (cd $d && PYTHONPATH=$d timeout 140 python3 -m benchmarks.offload --stacks moe --steps 6 --rounds 4 --out $OUT/$v$r > $OUT/$v$r.log 2>&1)
    echo "$v round $r rc=$?"; grep -E '^ +(none|\* auto) |interleaved' $OUT/$v$r.log | cut -c1-120
  done
done
