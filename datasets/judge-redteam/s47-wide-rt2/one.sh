#!/bin/bash
# one.sh VARIANT PARAMS [SPEC] -> verdict + paired figures
v=$1; p=$2; spec=${3:-pipelines/rmsnorm-cpu.yaml}
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../../.." && . .venv/bin/activate
tag=$v-$(echo "$p" | tr -dc '0-9')-$(basename $spec .yaml)-$RANDOM$RANDOM
mkdir -p ${RUNS:-/tmp/s47-wide-rt2-runs}; rd=${RUNS:-/tmp/s47-wide-rt2-runs}/$tag
python -m runner.cli eval $spec --params "$p" --variant "$HERE/$v.cpp.j2" --run-dir $rd --json > $rd.json 2>$rd.err
st=$(python -c "import json,sys; d=json.load(open('$rd.json')); print(d['status'], '|', d.get('reason','')[:600])" 2>/dev/null || echo "ERR $(tail -2 $rd.err)")
fig=$(python -m runner.cli show $rd 2>/dev/null | grep -i "fp32/fp64" | sed 's/^ *//')
echo "$v $p $(basename $spec .yaml): $st"
[ -n "$fig" ] && echo "    $fig"
