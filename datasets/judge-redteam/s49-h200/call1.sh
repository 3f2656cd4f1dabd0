#!/bin/bash
# Session 49, call 1, on the GPU machine from the repo root after tools/device-run.sh has
# installed the wheels (/tmp/site): the approved templates of the tensor-core and attention
# specs judged with the subnormal witness rows on the CUDA backend (inputs.SUBNORMAL_BACKENDS as
# committed), and moe-fine-h200 once without them first (this copy of the tree patched back for
# that one trial), each with its wall time: a slow trial told from a hang.
#   bash datasets/judge-redteam/s49-h200/call1.sh OUT_DIR
out=${1:-/tmp/s49-call1}; mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ev() {  # NAME SPEC
  local s; s=$(date +%s)
  python3 -m runner.cli eval "pipelines/$2.yaml" --params '{}' --run-dir "/tmp/s49-$1" --json --no-hw-check \
    > "$out/$1.json" 2> "$out/$1.err"
  v=$(python3 -c "import json; d=json.load(open('$out/$1.json')); print(d['status'], '|', (d.get('reason') or '')[:400])" \
      2>/dev/null || echo "ERR $(tail -3 "$out/$1.err")")
  echo "$1 ($(( $(date +%s) - s )) s): $v" | tee -a "$out/probe.txt"
}
on='SUBNORMAL_BACKENDS = ("cpu", "cuda")'; off='SUBNORMAL_BACKENDS = ("cpu",)'
grep -qxF "$on" runner/judge/inputs.py || { echo "the tree does not draw the rows on cuda" | tee -a "$out/probe.txt"; exit 1; }
sed -i "s/^${on//\"/\\\"}\$/${off//\"/\\\"}/" runner/judge/inputs.py
grep -qxF "$off" runner/judge/inputs.py || { echo "patch failed" | tee -a "$out/probe.txt"; exit 1; }
ev moe-fine-without-rows moe-fine-h200
sed -i "s/^${off//\"/\\\"}\$/${on//\"/\\\"}/" runner/judge/inputs.py
grep -qxF "$on" runner/judge/inputs.py || { echo "unpatch failed" | tee -a "$out/probe.txt"; exit 1; }
for s in moe-fine-h200 moe-fine-tma-h200 decode-attention-h200; do ev "$s" "$s"; done
