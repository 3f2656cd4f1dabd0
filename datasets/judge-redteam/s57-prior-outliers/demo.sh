#!/bin/bash
# usage: demo.sh TELL N  -- `pipe eval` of tests/data/TELL.cpp.j2 on rmsnorm-cpu N times, prints each status
cd /tmp/rt57
for i in $(seq 1 $2); do
  d=$(mktemp -d /tmp/rt57-demo.XXXX)
  PYTHONPATH=/tmp/rt57 /work/main/.venv/bin/python -m runner.cli eval pipelines/rmsnorm-cpu.yaml \
    --params '{"ACC": 32, "UNROLL": 1, "THREADS": 1}' --variant tests/data/$1.cpp.j2 --run-dir $d/run --json \
    2>/dev/null | /work/main/.venv/bin/python -c "import json,sys; g=json.load(sys.stdin); print(g['status'], (g.get('reason') or '')[:200])"
  rm -rf $d
done
