#!/usr/bin/env bash
# Session 38c's CPU red-team reproducers (after f6597dd/52ee00b/34f8a6e), judged by the project's
# own CLI next to the honest template.
#   cd /work/main && . .venv/bin/activate && bash datasets/judge-redteam/s38c/run.sh [wide|...|all]
# wide (about 3 min): finding A, an rmsnorm variant wrong wherever M > 2 * tune(N), rows that
#   domain.wide_rows never draws: `pipe eval` on rmsnorm-range-cpu (honest, variant: both ok), on
#   the same spec with two such sizes added to its extra shapes (the variant wrong there), and
#   `pipe compare` of the variant's run (it lists the variant; none of its sweep sizes is wrong).
# memo (about 30 s): a failed attempt, for the record: s38's delta memo (../s38/moe_delta.cpp.j2)
#   on the judge with f6597dd's dense salt, next to the honest template and the memo-off control;
#   T = 1 is the one moe-cpu shape Judge._dense leaves sparse.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
OUT=${OUT:-/tmp/s38c-out}
mkdir -p "$OUT"
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
what=${1:-all}

if [ "$what" = wide ] || [ "$what" = all ]; then
  P='{"ACC":8,"THREADS":1,"UNROLL":1}'
  echo "== A: wrong at rows above twice the tuning rows (rmsnorm-range-cpu at $P)"
  for spec in rmsnorm-range-cpu.yaml rmsnorm-range-cpu-probe.yaml; do
    for v in "" rmsnorm_wide.cpp.j2; do
      d=$OUT/rw-$(basename $spec .yaml)-${v:-honest}; rm -rf "$d"
      python -m runner.cli eval $spec --params "$P" ${v:+--variant $v} --run-dir "$d" --json > "$d.json" 2> "$d.err"
      python -c "import json; v=json.load(open('$d.json')); print('$spec', '${v:-honest}', v['status'], (v.get('reason') or '')[:220])"
    done
  done
  echo "-- pipe compare on the variant's run folder (no compile/Triton/arms, 4 secret points)"
  timeout 500 python -m runner.cli compare "$OUT/rw-rmsnorm-range-cpu-rmsnorm_wide.cpp.j2" --no-compile --no-triton \
    --no-arms --points 4 -q 2>&1 | sed -n '1,30p'
fi

if [ "$what" = memo ] || [ "$what" = all ]; then
  echo "== memo: s38's delta memo on the dense salt (moe-cpu, shapes T=16,1,4,64)"
  ( cd ../s38 && export OUT=$OUT/memo && mkdir -p "$OUT" && source ../keep_report.sh && P='{"MR":4,"NR":16}' &&
    one honest "$OUT/runs/honest" && one delta "$OUT/runs/delta" moe_delta.cpp.j2 &&
    one control "$OUT/runs/control" moe_delta_off.cpp.j2 && one delta2 "$OUT/runs/delta2" moe_delta.cpp.j2 &&
    one honest2 "$OUT/runs/honest2" )
fi
