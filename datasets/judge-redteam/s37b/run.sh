#!/usr/bin/env bash
# Session 37b's red team of the fix at 83925c1 (a CPU call charged at least the CPU its kernel host
# spent): attack P, the work done while the host sleeps on `go` after `ack`, where the judge reads
# the host's CPU time as its starting point and waits, with no limit but ACK_TIMEOUT_S, for it to
# sleep. Three parts:
#   1. the bare harness (cpu_host.Host, threads=1): honest vs cheat, interleaved, the judge's order
#      (prime/ack, refresh, timed, census), answers checked;
#   2. the moe-cpu variant (moe_primed.cpp.j2) judged by `pipe eval` next to the honest template,
#      then in one run folder (honest trial 1, the variant trial 2: the paired re-timing decides
#      the keep), then `pipe compare` on that folder;
#   3. the probes of the other classes (harness_probes.py).
#   cd /work/main && . .venv/bin/activate && bash datasets/judge-redteam/s37b/run.sh   # ~2 min
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
OUT=${OUT:-/tmp/s37b-out}
rm -rf "$OUT"; mkdir -p "$OUT"
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
echo "== 1. harness: work in the primed sleep (40000 steps, ~70 us), 31 calls each, interleaved"
g++ -O2 -shared -fPIC primed.cpp -o "$OUT/primed.so" || exit 1
python harness_primed.py "$OUT/primed.so" 40000 31
echo "== 2. pipe eval (moe-cpu, MR=1 NR=4; times at T = 16, 1, 4, 64)"
P='{"MR":1,"NR":4}'
source ../keep_report.sh  # one NAME RUNDIR [VARIANT]: pipe eval of moe-cpu.yaml at $P, its verdict line
echo "name status kept t(T=16) t(T=1) reason"
one honest "$OUT/runs/honest"
one primed "$OUT/runs/primed" moe_primed.cpp.j2
one honest_again "$OUT/runs/honest2"
one primed_again "$OUT/runs/primed2" moe_primed.cpp.j2
echo "-- one run folder: honest (trial 1), then the variant (trial 2, re-timed against trial 1)"
one keep_1_honest "$OUT/runs/keep"
one keep_2_primed "$OUT/runs/keep" moe_primed.cpp.j2
keep_report "$OUT/runs/keep"
if [ -f harness_probes.py ]; then
  echo "== 3. probes of the other classes"
  g++ -O2 -shared -fPIC -pthread probes.cpp -o "$OUT/probes.so" || exit 1
  python harness_probes.py "$OUT/probes.so"
fi
