#!/bin/bash
# usage: redteam/evals.sh SPEC VARIANT N [PARAMS]  -- N `pipe eval`s of VARIANT (or "honest") on SPEC
# prints: status, per-shape times (ms), reason
cd /tmp/rt58
P=${4:-'{"ACC": 32, "UNROLL": 1, "THREADS": 1}'}
for i in $(seq 1 $3); do
  d=$(mktemp -d /tmp/rt58w/ev.XXXX)
  if [ "$2" = honest ]; then V=(); else V=(--variant "$2"); fi
  PYTHONPATH=/tmp/rt58 /work/main/.venv/bin/python -m runner.cli eval "$1" --params "$P" "${V[@]}" \
    --run-dir $d/run --json 2>$d/err | /work/main/.venv/bin/python -c "
import json,sys; g=json.load(sys.stdin)
print(g['status'], ' '.join('%.3f' % (s['time_s']*1e3) for s in g.get('shapes') or []), (g.get('reason') or '')[:300])"
  rm -rf $d
done
