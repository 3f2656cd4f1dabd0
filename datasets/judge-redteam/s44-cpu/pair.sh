#!/bin/bash
# usage: pair.sh SPEC PARAMS INCUMBENT_VARIANT CANDIDATE_VARIANT RUNDIR
# judges the incumbent first (kept as the first correct trial), then the candidate: its keep is decided by the paired re-timing
set -e
rm -rf "$5"
pipe eval "$1" --params "$2" --variant "$3" --run-dir "$5" > /dev/null 2>&1 || true
pipe eval "$1" --params "$2" --variant "$4" --run-dir "$5" 2>&1 | grep -E "^trial|^  shape|kept" || true
python3 - "$5" <<'PY'
import sqlite3, json, sys
c = sqlite3.connect(sys.argv[1] + '/ledger.db')
for i, st, kept, obj, det in c.execute("select id,status,kept,objective,details from trials"):
    d = json.loads(det or '{}'); l = d.get('lean') if isinstance(d.get('lean'), dict) else {}
    print(f"  row {i}: {st} kept={kept} objective_us={obj*1e6 if obj else None:.2f} retime={d.get('retime')} lean_off={l.get('off')}")
PY
