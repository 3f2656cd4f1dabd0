#!/usr/bin/env bash
# Session 37's CPU red-team reproducer: a moe-cpu variant that writes its host's `done` word at the
# start of each call and does the whole GEMM after it (cpu_host.Host.timed charges only the part of
# the gap after `done` beyond its calibrated allowance). Judged by the project's own CLI, next to the
# honest template, then in one run folder (honest first, the variant second: the paired re-timing
# decides the keep), then `pipe compare` on that folder.
#   cd /work/main && . .venv/bin/activate && bash datasets/judge-redteam/s37/run.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
OUT=${OUT:-/tmp/s37-out}
rm -rf "$OUT"; mkdir -p "$OUT"
P='{"MR":1,"NR":4}'
source ../keep_report.sh  # one NAME RUNDIR [VARIANT]: pipe eval of moe-cpu.yaml at $P, its verdict line
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
echo "name status kept t(T=16) t(T=1) reason   [4 timed shapes: T=16,1,4,64]"
one honest "$OUT/runs/honest"
one early_done "$OUT/runs/early" moe_early_done.cpp.j2
echo "-- one run folder: honest (trial 1), then the variant (trial 2, re-timed against trial 1)"
one keep_1_honest "$OUT/runs/keep"
one keep_2_early_done "$OUT/runs/keep" moe_early_done.cpp.j2
keep_report "$OUT/runs/keep"
