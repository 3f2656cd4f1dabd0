#!/bin/bash
for i in 1 2 3 4 5; do
  for s in moe-cpu moe-swiglu-cpu; do
    d=/tmp/rg58w/honest-$s-$i; rm -rf $d
    printf "%s %s " $s $i
    python -m runner.cli eval pipelines/$s.yaml --params '{"MR": 2, "NR": 8}' --variant kernel_templates/moe_gemm.cpp.j2 --run-dir $d --json 2>/dev/null \
      | python -c 'import json,sys; r=json.load(sys.stdin); print(r.get("status"), (r.get("reason") or "")[:200])'
  done
done
