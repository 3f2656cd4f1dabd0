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
line() { python ../verdict_line.py "$OUT/$1.json" moe-cpu "$1" "$2" "$3" | cut -f2-6,8;
         python -c "import json,sys; v=json.load(open('$OUT/$1.json')); print('    times_us', [round(d['time_s']*1e6,1) for d in v.get('shapes') or []], 'objective_us', round((v.get('objective_s') or 0)*1e6,1), 'retime', (v.get('retime') or ''))"; }
one() {  # one NAME RUNDIR [VARIANT]
  local t0=$(date +%s) args=(moe-cpu.yaml --params "$P" --run-dir "$2" --json)
  [ -n "${3:-}" ] && args+=(--variant "$3")
  python -m runner.cli eval "${args[@]}" > "$OUT/$1.json" 2> "$OUT/$1.stderr"
  line "$1" $? $(( $(date +%s) - t0 ))
}
echo "name status kept t(T=16) t(T=1) reason"
one honest "$OUT/runs/honest"
one primed "$OUT/runs/primed" moe_primed.cpp.j2
one honest_again "$OUT/runs/honest2"
one primed_again "$OUT/runs/primed2" moe_primed.cpp.j2
echo "-- one run folder: honest (trial 1), then the variant (trial 2, re-timed against trial 1)"
one keep_1_honest "$OUT/runs/keep"
one keep_2_primed "$OUT/runs/keep" moe_primed.cpp.j2
python - "$OUT/runs/keep" <<'PY'
import json, sqlite3, sys
c = sqlite3.connect(f"{sys.argv[1]}/ledger.db")
for i, d in c.execute("select id, details from trials"):
    r = json.loads(d).get("retime")
    if r: print(f"    trial {i} retime vs the incumbent: {r}")
PY
echo "-- pipe compare on that folder (no torch.compile/Triton/arms, 4 secret points)"
timeout 300 python -m runner.cli compare "$OUT/runs/keep" --no-compile --no-triton --no-arms --points 4 -q 2>&1 | sed -n '1,12p'
if [ -f harness_probes.py ]; then
  echo "== 3. probes of the other classes"
  g++ -O2 -shared -fPIC -pthread probes.cpp -o "$OUT/probes.so" || exit 1
  python harness_probes.py "$OUT/probes.so"
fi
