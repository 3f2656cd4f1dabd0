#!/bin/bash
# usage: evals.sh SPEC VARIANT PARAMS -- one `pipe eval --variant` in a fresh run folder; prints status, ms per shape, reason
cd /tmp/rt64 && . .venv/bin/activate
d=$(mktemp -d /tmp/rt64w/ev.XXXX)
pipe eval "$1" --params "$3" --variant "$2" --run-dir $d/run --json 2>$d/err | python -c "
import json,sys; g=json.load(sys.stdin); print(g['status'], [round(s['time_s']*1e3,3) for s in g.get('shapes') or [] if s.get('time_s')], (g.get('reason') or '')[:600])"
