#!/bin/bash
# one.sh VARIANT PARAMS [SPEC] -> one verdict line + paired figures ('-' as VARIANT: the approved template)
v=$1; p=$2; spec=${3:-pipelines/rmsnorm-cpu.yaml}
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../../.." && . .venv/bin/activate
tag=$(basename $v .cpp.j2)-$(echo "$p" | tr -dc '0-9')-$(basename $spec .yaml)-$RANDOM
R=${RUNS:-/tmp/rt49-runs}; mkdir -p $R; rd=$R/$tag
if [ "$v" = "-" ]; then va=""; else va="--variant $HERE/$v"; fi
t0=$(date +%s)
PYTHONPATH=$HERE/../../.. python -m runner.cli eval $spec --params "$p" $va --run-dir $rd --json > $rd.json 2>$rd.err
rc=$?
st=$(python -c "
import json; d=json.load(open('$rd.json'))
sh=' '.join(f\"{s['time_s']*1e6:.1f}us\" for s in (d.get('shapes') or []))
print(d['status'], '| times', sh or '-', '| metric', d.get('metric'), '|', (d.get('reason') or '')[:600])" 2>/dev/null || echo "ERR rc=$rc $(tail -2 $rd.err)")
echo "$(basename $v .cpp.j2) $p $(basename $spec .yaml): $st  [$(( $(date +%s) - t0 ))s, $rd]"
fig=$(PYTHONPATH=$HERE/../../.. python -m runner.cli show $rd 2>/dev/null | grep -i "fp32/fp64\|paired\|precision" | head -3 | sed 's/^ */    /')
[ -n "$fig" ] && echo "$fig"
exit 0
