# Sourced by a red team's run.sh (it sets OUT and P, and runs from its own folder):
# one NAME RUNDIR [VARIANT] judges moe-cpu.yaml at the parameters P with `pipe eval` (the
# variant's template if given) and prints its verdict line; keep_report RUN_DIR prints each trial's paired re-timing
# against the incumbent (the keep decision) and the range table `pipe compare` makes of it.
keep_report() {
  python - "$1" <<'PY'
import json, sqlite3, sys
c = sqlite3.connect(f"{sys.argv[1]}/ledger.db")
for i, d in c.execute("select id, details from trials"):
    r = json.loads(d).get("retime")
    if r: print(f"    trial {i} retime vs the incumbent: {r}")
PY
  echo "-- pipe compare on that folder (no torch.compile/Triton/arms, 4 secret points)"
  timeout 300 python -m runner.cli compare "$1" --no-compile --no-triton --no-arms --points 4 -q 2>&1 | sed -n '1,12p'
}

line() { python ../verdict_line.py "$OUT/$1.json" moe-cpu "$1" "$2" "$3" | cut -f2-6,8;
         python -c "import json,sys; v=json.load(open('$OUT/$1.json')); print('    times_us', [round(d['time_s']*1e6,1) for d in v.get('shapes') or []], 'objective_us', round((v.get('objective_s') or 0)*1e6,1), 'retime', (v.get('retime') or ''))"; }
one() {
  local t0=$(date +%s) args=(moe-cpu.yaml --params "$P" --run-dir "$2" --json)
  [ -n "${3:-}" ] && args+=(--variant "$3")
  python -m runner.cli eval "${args[@]}" > "$OUT/$1.json" 2> "$OUT/$1.stderr"
  line "$1" $? $(( $(date +%s) - t0 ))
}
