"""One line of a red-team batch's verdicts.tsv from a `pipe eval --json` file:

    python verdict_line.py EVAL.json SPEC NAME RC SECONDS >> verdicts.tsv

spec, name, status, kept, the first two shapes' times in µs, the seconds it took, the reason."""
import json
import sys

path, spec, name, rc, secs = sys.argv[1:]
try:
    v = json.load(open(path))
except Exception as e:
    print(f"{spec}\t{name}\tNO-VERDICT(rc={rc})\t\t\t\t{secs}\t{type(e).__name__}: see {path[:-5]}.stderr")
    sys.exit()
sh = [f"{d['time_s'] * 1e6:.2f}" if d.get("time_s") else "" for d in (v.get("shapes") or [])] + ["", ""]
print(f"{spec}\t{name}\t{v['status']}\t{v.get('kept')}\t{sh[0]}\t{sh[1]}\t{secs}\t{(v.get('reason') or '')[:300]}")
