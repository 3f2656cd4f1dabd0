#!/usr/bin/env bash
# Session 38's CPU red-team reproducers, judged by the project's own CLI next to the honest template.
#   cd /work/main && . .venv/bin/activate && bash datasets/judge-redteam/s38/run.sh [delta|range|prio|all]
# delta (about 60 s): finding A, a memo of the timed value sets' answers corrected for the fresh calls'
#   changed elements (moe-cpu): the honest template, the same variant with its memo off, the variant;
#   then one run folder (honest trial 1, the variant trial 2: the keep's paired re-timing) and
#   `pipe compare` on it.
# range (about 60 s): finding B, an rmsnorm variant wrong wherever M > 64 is not a tuning row count:
#   `pipe eval` on rmsnorm-range-cpu (honest, variant: both ok), on the same spec with two ordinary
#   sizes added to its extra shapes (the variant wrong there), and `pipe compare` of the variant's run.
# prio (1 s): finding C, setpriority(PRIO_PGRP, 0, 19) from a filtered, capability-less host.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
OUT=${OUT:-/tmp/s38-out}
mkdir -p "$OUT"
source ../keep_report.sh  # one NAME RUNDIR [VARIANT]: pipe eval of moe-cpu.yaml at $P; keep_report RUNDIR
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
what=${1:-all}

if [ "$what" = delta ] || [ "$what" = all ]; then
  P='{"MR":4,"NR":16}'
  rm -rf "$OUT/runs"
  echo "== A: delta memo (moe-cpu at $P)"
  echo "name status kept t(T=16) t(T=1) reason   [4 timed shapes: T=16,1,4,64]"
  one honest "$OUT/runs/honest"
  one control_no_memo "$OUT/runs/control" moe_delta_off.cpp.j2
  one delta "$OUT/runs/delta" moe_delta.cpp.j2
  one control_no_memo2 "$OUT/runs/control2" moe_delta_off.cpp.j2
  one delta2 "$OUT/runs/delta2" moe_delta.cpp.j2
  one honest2 "$OUT/runs/honest2"
  echo "-- one run folder: honest (trial 1), then the variant (trial 2, re-timed against trial 1)"
  one keep_1_honest "$OUT/runs/keep"
  one keep_2_delta "$OUT/runs/keep" moe_delta.cpp.j2
  keep_report "$OUT/runs/keep"
fi

if [ "$what" = range ] || [ "$what" = all ]; then
  P='{"ACC":8,"THREADS":1,"UNROLL":1}'
  echo "== B: wrong at rows the domain draws never reach (rmsnorm-range-cpu at $P)"
  for spec in rmsnorm-range-cpu.yaml rmsnorm-range-cpu-probe.yaml; do
    for v in "" rmsnorm_rows.cpp.j2; do
      d=$OUT/rr-$(basename $spec .yaml)-${v:-honest}; rm -rf "$d"
      python -m runner.cli eval $spec --params "$P" ${v:+--variant $v} --run-dir "$d" --json > "$d.json" 2> "$d.err"
      python -c "import json; v=json.load(open('$d.json')); print('$spec', '${v:-honest}', v['status'], (v.get('reason') or '')[:220])"
    done
  done
  echo "-- pipe compare on the variant's run folder (no compile/Triton/arms, 4 secret points)"
  timeout 500 python -m runner.cli compare "$OUT/rr-rmsnorm-range-cpu-rmsnorm_rows.cpp.j2" --no-compile --no-triton \
    --no-arms --points 4 -q 2>&1 | sed -n '1,22p'
fi

if [ "$what" = prio ] || [ "$what" = all ]; then
  echo "== C: setpriority(PRIO_PGRP) through the host's filter (a process group of its own)"
  setsid python prio_filter.py
fi
