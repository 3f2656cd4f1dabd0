#!/bin/bash
# usage: redteam/evals.sh SPEC VARIANT N [PARAMS]  -- N `pipe eval`s of VARIANT (or "honest") on SPEC
cd /tmp/rt62
P=${4:-'{"ACC": 32, "UNROLL": 1, "THREADS": 1}'}
mkdir -p /tmp/rt62w
for i in $(seq 1 $3); do
  d=$(mktemp -d /tmp/rt62w/ev.XXXX)
  if [ "$2" = honest ]; then V=(); else V=(--variant "$2"); fi
  /tmp/rt62/.venv/bin/python -m runner.cli eval "$1" --params "$P" "${V[@]}" \
    --run-dir $d/run --json 2>$d/err | /tmp/rt62/.venv/bin/python -c "
import json,sys
try:
  g=json.load(sys.stdin)
except Exception as e:
  print('NOJSON'); sys.exit()
print(g['status'], ' '.join('%.3f' % (s['time_s']*1e3) for s in g.get('shapes') or [] if s.get('time_s')), (g.get('reason') or '')[:400])" || tail -5 $d/err
  [ -n "$KEEP" ] || rm -rf $d
done
