#!/bin/bash
# usage: run.sh VARIANT [PARAMS] [TAG]  -> one line: verdict, reason, precision
cd "$(dirname "$0")/../../.."
. .venv/bin/activate 2>/dev/null || true
export PYTHONPATH=$PWD
v=$1; p=${2:-'{"MR":2,"NR":8}'}; tag=${3:-0}
d=/tmp/rt46v2runs/$v-$(echo $p | tr -dc 0-9)-$tag
rm -rf "$d"
st=$(python -m runner eval pipelines/moe-swiglu-cpu.yaml --params "$p" --variant datasets/judge-redteam/s46-precision-rt2/$v.cpp.j2 --run-dir "$d" --json 2>/dev/null \
     | python -c 'import json,sys; j=json.load(sys.stdin); print(j["status"], (j.get("reason") or "")[:230])')
pr=$(sqlite3 "$d/ledger.db" "select json_extract(details,'\$.precision') from trials" 2>/dev/null)
echo "$v $p #$tag: $st | $pr"
