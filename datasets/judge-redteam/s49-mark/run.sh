#!/bin/bash
# A kernel that tells timed calls by a mark it hides in its own output (the XOR of the low 4 bits
# of out[0..15] and of out[16..31]) and reads subnormal inputs as 0 there alone: m01; m00 sets the
# mark and cheats nowhere (the control). From anywhere:
#   bash datasets/judge-redteam/s49-mark/run.sh [SPEC]
H=$(cd "$(dirname "$0")" && pwd); cd "$H/../../.." && . .venv/bin/activate
spec=${1:-pipelines/rmsnorm-cpu.yaml}; P='{"ACC":8,"THREADS":1,"UNROLL":2}'
for v in m00_mark_only m01_daz_when_own_mark; do
  rd=$(mktemp -d /tmp/s49-mark-XXXX)
  PYTHONPATH=$PWD python -m runner.cli eval "$spec" --params "$P" --variant "$H/$v.cpp.j2" --run-dir "$rd" --json \
    > "$rd.json" 2> "$rd.err"
  python3 -c "import json,sys; d=json.load(open('$rd.json')); print('$v:', d['status'], '|', (d.get('reason') or '')[:300])"
done
