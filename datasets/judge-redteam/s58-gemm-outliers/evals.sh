#!/bin/bash
# usage: evals.sh SPEC VARIANT N TAG  -> prints one verdict per eval
SPEC=$1; VAR=$2; N=$3; TAG=$4
for i in $(seq 1 $N); do
  d=/tmp/rg58w/$TAG-$i; rm -rf $d
  python -m runner.cli eval $SPEC --params '{"MR": 2, "NR": 8}' --variant $VAR --run-dir $d --json 2>/dev/null \
    | python -c 'import json,sys; r=json.load(sys.stdin); print(r.get("verdict") or r.get("status"), (r.get("reason") or r.get("detail") or "")[:150])'
done
