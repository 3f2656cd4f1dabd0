#!/usr/bin/env bash
# Session 36b's CUDA red-team reproducers (the fresh timed inputs of session 36), judged by the
# project's own CLI (pipe eval) on the GPU.
#   from the repo root:   OUT=/tmp/out bash datasets/judge-redteam/s36b/run.sh
# Writes $OUT/<spec>-<name>.json (pipe eval --json), $OUT/verdicts.tsv (one line each) and the
# run folders under $OUT/runs. 5 evals, about 50 s on an H200 (BUDGET_S=70: no eval starts later).
set -u
HERE=datasets/judge-redteam/s36b
S36=datasets/judge-redteam/s36
: "${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/runs"
PYTHON=${PYTHON:-python3}
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-70}
printf "spec\tname\tstatus\tkept\tshape0_us\tshape1_us\tsecs\treason\n" > "$OUT/verdicts.tsv"

one() {  # one(spec-yaml, name, params-json, variant-file-or-empty)
  local yaml=$1 name=$2 params=$3 variant=$4 spec t1 rc left
  spec=$(basename "$yaml" .yaml)
  left=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ "$left" -le 5 ]; then
    printf "%s\t%s\tSKIPPED\t\t\t\t\tout of time budget\n" "$spec" "$name" >> "$OUT/verdicts.tsv"; return
  fi
  [ "$left" -gt 30 ] && left=30
  t1=$(date +%s)
  local args=("$yaml" --params "$params" --run-dir "$OUT/runs/$spec-$name" --json)
  [ -n "$variant" ] && args+=(--variant "$variant")
  timeout "$left" "$PYTHON" -m runner.cli eval "${args[@]}" > "$OUT/$spec-$name.json" 2> "$OUT/$spec-$name.stderr"
  rc=$?
  "$PYTHON" datasets/judge-redteam/verdict_line.py "$OUT/$spec-$name.json" "$spec" "$name" "$rc" \
    "$(( $(date +%s) - t1 ))" >> "$OUT/verdicts.tsv"
  tail -n 1 "$OUT/verdicts.tsv"
}

# cross-entropy: the honest template, then a real memo of each row's logsumexp (no stand-in)
one "$HERE/xent-memo.yaml" honest '{"BLOCK":1024}' ""
one "$HERE/xent-memo.yaml" lse_memo '{"BLOCK":1024}' "$HERE/v_xent_lse_memo.cu.j2"
# session 36's softmax spec: the lse memo with s36's stand-in spin, then its two controls
one "$S36/softmax-stash.yaml" lse_memo '{"BLOCK":256}' "$HERE/v_softmax_lse_memo.cu.j2"
one "$S36/softmax-stash.yaml" slowed '{"BLOCK":256}' "$S36/v_slowed.cu.j2"
one "$S36/softmax-stash.yaml" honest '{"BLOCK":256}' ""
echo "total $(( $(date +%s) - T0 )) s"
column -t -s $'\t' "$OUT/verdicts.tsv" 2>/dev/null || cat "$OUT/verdicts.tsv"
