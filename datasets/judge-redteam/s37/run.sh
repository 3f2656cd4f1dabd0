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
line() { python ../verdict_line.py "$OUT/$1.json" moe-cpu "$1" "$2" "$3" | cut -f2-6,8;
         python -c "import json,sys; v=json.load(open('$OUT/$1.json')); print('    times_us', [round(d['time_s']*1e6,1) for d in v.get('shapes') or []], 'objective_us', round((v.get('objective_s') or 0)*1e6,1), 'retime', (v.get('retime') or ''))"; }
one() {  # one NAME RUNDIR [VARIANT]
  local t0=$(date +%s) args=(moe-cpu.yaml --params "$P" --run-dir "$2" --json)
  [ -n "${3:-}" ] && args+=(--variant "$3")
  python -m runner.cli eval "${args[@]}" > "$OUT/$1.json" 2> "$OUT/$1.stderr"
  line "$1" $? $(( $(date +%s) - t0 ))
}
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
echo "name status kept t(T=16) t(T=1) reason   [4 timed shapes: T=16,1,4,64]"
one honest "$OUT/runs/honest"
one early_done "$OUT/runs/early" moe_early_done.cpp.j2
echo "-- one run folder: honest (trial 1), then the variant (trial 2, re-timed against trial 1)"
one keep_1_honest "$OUT/runs/keep"
one keep_2_early_done "$OUT/runs/keep" moe_early_done.cpp.j2
python - "$OUT/runs/keep" <<'PY'
import json, sqlite3, sys
c = sqlite3.connect(f"{sys.argv[1]}/ledger.db")
for i, d in c.execute("select id, details from trials"):
    r = json.loads(d).get("retime")
    if r: print(f"    trial {i} retime vs the incumbent: {r}")
PY
echo "-- pipe compare on that folder (no torch.compile/Triton/arms, 4 secret points)"
timeout 300 python -m runner.cli compare "$OUT/runs/keep" --no-compile --no-triton --no-arms --points 4 -q 2>&1 | sed -n '1,12p'
