#!/bin/bash
# one.sh VARIANT PARAMS [SPEC] -> one verdict line with the paired figures
v=$1; p=$2; spec=${3:-pipelines/moe-cpu.yaml}
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../../.." && . .venv/bin/activate
tag=$(basename $v .cpp.j2)-$(echo "$p" | tr -dc '0-9')-$(basename $spec .yaml)-$RANDOM
R=${RUNS:-/tmp/s50-rt-runs}; mkdir -p $R; rd=$R/$tag
if [ "$v" = "-" ]; then va=""; else va="--variant $HERE/$v"; fi
t0=$(date +%s)
PYTHONPATH=$HERE/../../.. python -m runner.cli eval $spec --params "$p" $va --run-dir $rd --json --no-hw-check > $rd.json 2>$rd.err
rc=$?
st=$(python -c "
import json; d=json.load(open('$rd.json'))
pr=None
try: pr=json.load(open('$rd/run.json')).get('best',{}).get('precision')
except Exception: pass
print(d['status'], '|', pr if d['status']=='ok' else '', '|', (d.get('reason') or '')[:700])" 2>/dev/null || echo "ERR rc=$rc $(tail -2 $rd.err)")
echo "$(basename $v .cpp.j2) $p $(basename $spec .yaml): $st  [$(( $(date +%s) - t0 ))s]"
exit 0
