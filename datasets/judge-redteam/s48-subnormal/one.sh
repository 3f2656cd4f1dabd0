#!/bin/bash
# one.sh VARIANT(.cpp.j2 basename, or "-" for the approved template) PARAMS SPEC -> verdict + figures
# (from anywhere; SPEC relative to the repo root; run folders under ${RUNS:-/tmp/s48-subnormal-runs})
v=$1; p=$2; spec=$3
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../../.." && . .venv/bin/activate
mkdir -p ${RUNS:-/tmp/s48-subnormal-runs}
name=$([ "$v" = "-" ] && echo approved || echo "$v")
rd=${RUNS:-/tmp/s48-subnormal-runs}/$name-$(basename $spec .yaml)-$RANDOM$RANDOM
if [ "$v" = "-" ]; then va=(); else va=(--variant "$HERE/$v.cpp.j2"); fi
python -m runner.cli eval $spec --params "$p" "${va[@]}" --run-dir $rd --json > $rd.json 2>$rd.err
python - "$rd" <<'PY'
import json,sys
rd=sys.argv[1]
try:
    d=json.load(open(rd+'.json')); print(d['status'],'|',(d.get('reason') or '')[:400],'| objective_s',d.get('objective_s'))
except Exception as e: print('ERR', open(rd+'.err').read()[-600:])
PY
