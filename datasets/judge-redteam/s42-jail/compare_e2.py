"""E2 effect: the same three trials with the escaped helper burning (BURN_S=15) and not (BURN_S=0).
    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s42-jail/compare_e2.py"""
import json, sqlite3, subprocess, sys, time
from pathlib import Path
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness
rows = {}
for burn in ("0", "15", "0"):
    name = f"e2_burn{burn}"
    harness.run(name, str(HERE / "agent_escape.py"), 3, {"workdir": f"/tmp/s42-jail/{name}_work"}, [burn])
    con = sqlite3.connect(f"/tmp/s42-jail/{name}/run/ledger.db")
    rows.setdefault(burn, []).append([(i, st, obj and round(obj * 1e6, 2), json.loads(times or "[]"), reason)
                                      for i, st, obj, times, reason in
                                      con.execute("select id, status, objective, times, reason from trials")])
    log = Path(f"/tmp/s42-jail/{name}_work/helper.log")
    print("helper log:", log.read_text().splitlines()[:2] if log.exists() else None)
    time.sleep(16)  # let the helper's time run out before the next run
for burn, runs in rows.items():
    for r in runs:
        print(f"BURN_S={burn}:")
        for row in r:
            print("   ", row)
