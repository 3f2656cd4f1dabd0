#!/usr/bin/env bash
# Session 38's CPU red-team reproducers, judged by the project's own CLI next to the honest template.
#   cd /work/main && . .venv/bin/activate && bash datasets/judge-redteam/s38/run.sh [delta|range|prio]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
OUT=${OUT:-/tmp/s38-out}
mkdir -p "$OUT"
P=${P:-'{"MR":4,"NR":16}'}
source ../keep_report.sh
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
what=${1:-delta}
if [ "$what" = delta ]; then
  rm -rf "$OUT/runs"
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
