#!/bin/bash
# Session 50, on the GPU machine from the repo root after tools/device-run.sh has installed the
# wheels (/tmp/site): each named spec's approved template judged once (pipe eval), with its wall
# time and the GPU's peak memory in use while it ran (nvidia-smi, every half second).
#   bash datasets/judge-redteam/s50-h200/eval.sh OUT_DIR SPEC...
out=${1:-/tmp/s50-eval}; shift; mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for spec in "$@"; do
  s=$(date +%s)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$out/$spec.mem" &
  smi=$!
  python3 -m runner.cli eval "pipelines/$spec.yaml" --params '{}' --run-dir "/tmp/s50-$spec" --json --no-hw-check \
    > "$out/$spec.json" 2> "$out/$spec.err"
  kill $smi
  v=$(python3 -c "import json; d=json.load(open('$out/$spec.json')); print(d['status'], '|', (d.get('reason') or '')[:400])" \
      2>/dev/null || echo "ERR $(tail -3 "$out/$spec.err")")
  peak=$(sort -n "$out/$spec.mem" | tail -1)
  echo "$spec ($(( $(date +%s) - s )) s, peak ${peak} MiB in use): $v" | tee -a "$out/eval.txt"
done
