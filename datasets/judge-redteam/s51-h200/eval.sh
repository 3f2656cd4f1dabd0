#!/bin/bash
# Session 51, on the GPU machine from the repo root after tools/device-run.sh has installed the
# wheels (/tmp/site): each line "SPEC PARAMS" of LIST judged once (pipe eval; PARAMS a JSON
# object, {} for the spec's start), with its wall time and the GPU's peak memory in use while
# it ran (nvidia-smi, every half second). Session 50's eval.sh took specs with a start only.
#   bash datasets/judge-redteam/s51-h200/eval.sh OUT_DIR LIST
out=${1:-/tmp/s51-eval}; list=$2; mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
i=0
while read -r spec params; do
  [ -z "$spec" ] || [ "${spec:0:1}" = "#" ] && continue
  i=$((i + 1)); tag="$i-$spec"; s=$(date +%s)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$out/$tag.mem" &
  smi=$!
  python3 -m runner.cli eval "pipelines/$spec.yaml" --params "$params" --run-dir "/tmp/s51-$tag" --json --no-hw-check \
    > "$out/$tag.json" 2> "$out/$tag.err"
  kill $smi
  v=$(python3 -c "import json; d=json.load(open('$out/$tag.json')); print(d['status'], '|', (d.get('reason') or '')[:400])" \
      2>/dev/null || echo "ERR $(tail -3 "$out/$tag.err")")
  peak=$(sort -n "$out/$tag.mem" | tail -1)
  echo "$tag $params ($(( $(date +%s) - s )) s, peak ${peak} MiB in use): $v" | tee -a "$out/eval.txt"
done < "$list"
