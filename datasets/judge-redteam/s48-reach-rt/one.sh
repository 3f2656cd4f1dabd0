#!/bin/bash
# one.sh VARIANT PARAMS [SPEC] -> verdict + paired figures ('-' as VARIANT: the approved template)
v=$1; p=$2; spec=${3:-pipelines/rmsnorm-cpu.yaml}
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../../.." && . .venv/bin/activate
tag=$(basename $v .cpp.j2)-$(echo "$p" | tr -dc '0-9')-$(basename $spec .yaml)-$RANDOM
R=${RUNS:-/tmp/rt48b-runs}; mkdir -p $R; rd=$R/$tag
if [ "$v" = "-" ]; then va=""; else va="--variant $HERE/$v"; fi
PYTHONPATH=$HERE/../../.. python -m runner.cli eval $spec --params "$p" $va --run-dir $rd --json > $rd.json 2>$rd.err
st=$(python -c "import json,sys; d=json.load(open('$rd.json')); print(d['status'], '|', (d.get('reason') or '')[:700], '| objective_s', d.get('objective_s'), 'metric', d.get('metric'))" 2>/dev/null || echo "ERR $(tail -2 $rd.err)")
fig=$(PYTHONPATH=$HERE/../../.. python -m runner.cli show $rd 2>/dev/null | grep -i "fp32/fp64" | sed 's/^ *//')
echo "$v $p $(basename $spec .yaml): $st"
[ -n "$fig" ] && echo "    $fig"
