#!/bin/bash
# Session 46 red team of 603723d (a variant's error held to the approved build's), CPU backend.
# Run from anywhere; uses the repository's runner (PYTHONPATH) and the shared venv.
set -u
cd "$(dirname "$0")/../../.."
. .venv/bin/activate 2>/dev/null || true
export PYTHONPATH=$PWD
S=pipelines/moe-swiglu-cpu.yaml
D=datasets/judge-redteam/s46-precision-rt
R=${RUNS:-/tmp/rt46runs/rs}
for v in moe_gemm honest_sigmoid_reorder honest_two_partial_sums honest_silu_double tanh_sigmoid \
         always_fexp3 always_fexp4 narrow_gu_12bits narrow_gu_10bits \
         mark_canary mark_fexp2 mark_fexp3 routing_gated_fexp3 small_T_fexp2 T1_fexp2; do
  for p in '{"MR":2,"NR":8}' '{"MR":4,"NR":16}' '{"MR":1,"NR":4}'; do
    d=$R/$v-$(echo $p | tr -dc 0-9)
    rm -rf "$d"
    st=$(python -m runner eval $S --params "$p" --variant $D/$v.cpp.j2 --run-dir "$d" --json 2>/dev/null \
         | python -c 'import json,sys; j=json.load(sys.stdin); print(j["status"], (j.get("reason") or "")[:160])')
    pr=$(sqlite3 "$d/ledger.db" "select json_extract(details,'\$.precision') from trials" 2>/dev/null)
    echo "$v $p: $st ${pr}"
  done
done
# standalone: each variant's error against float64 on a first call (random output buffer, as a
# judge's decoy) and a second call (its own output in the buffer, as in every timed call)
python $D/measure.py $D/*.cpp.j2
