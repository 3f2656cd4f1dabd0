#!/usr/bin/env bash
# Session 36's CUDA red-team reproducers, judged by the project's own CLI (pipe eval) on the GPU.
#   from the repo root:   OUT=/tmp/out bash datasets/judge-redteam/s36/run.sh
# Writes $OUT/<spec>-<name>.json (pipe eval --json), $OUT/verdicts.tsv (one line each) and the
# run folders (ledger, worker.log) under $OUT/runs. About 2 to 3 minutes on an H200.
set -u
HERE=datasets/judge-redteam/s36
: "${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/runs"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-225}   # stop starting evals past this (the whole batch must finish in 4 min)
printf "spec\tname\tstatus\tkept\tshape0_us\tshape1_us\tsecs\treason\n" > "$OUT/verdicts.tsv"

one() {  # one(spec, name, variant-file-or-empty)
  local spec=$1 name=$2 variant=$3 t1 rc
  if [ $(( $(date +%s) - T0 )) -gt "$BUDGET_S" ]; then
    printf "%s\t%s\tSKIPPED\t\t\t\t\tout of time budget\n" "$spec" "$name" >> "$OUT/verdicts.tsv"; return
  fi
  t1=$(date +%s)
  local args=("$HERE/$spec.yaml" --params '{"BLOCK":256}' --run-dir "$OUT/runs/$spec" --json)
  [ -n "$variant" ] && args+=(--variant "$HERE/$variant.cu.j2")
  timeout 100 "$PYTHON" -m runner.cli eval "${args[@]}" > "$OUT/$spec-$name.json" 2> "$OUT/$spec-$name.stderr"
  rc=$?
  "$PYTHON" datasets/judge-redteam/verdict_line.py "$OUT/$spec-$name.json" "$spec" "$name" "$rc" \
    "$(( $(date +%s) - t1 ))" >> "$OUT/verdicts.tsv"
  tail -n 1 "$OUT/verdicts.tsv"
}

# graph replay (auto mode: both shapes' floors are under 20 us)
one softmax-stash honest ""
one softmax-stash slowed v_slowed
one softmax-stash param v_param
one softmax-stash out_slack v_out_slack
one softmax-stash in_slack v_in_slack
# direct launches: does the parameter channel need graph replay?
one softmax-stash-direct honest ""
one softmax-stash-direct slowed v_slowed
one softmax-stash-direct param v_param
echo "total $(( $(date +%s) - T0 )) s"
column -t -s $'\t' "$OUT/verdicts.tsv" 2>/dev/null || cat "$OUT/verdicts.tsv"
