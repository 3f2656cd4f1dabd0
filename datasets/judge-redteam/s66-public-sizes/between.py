"""Red team B: the table's two kernels timed side by side, by pipe's own compare request
(ranges.Prober: the judge's worker, rotation, checks), at the public sizes (the grid points,
N a power of two) and at secret sizes inside the ranges. Usage: python out/between.py RUN [seed]"""
import math, random, sys, json, statistics
from pathlib import Path
from runner.ship.rundata import open_run
from runner.ship import ranges
from runner.judge.worker import Worker
from runner.build.builder import Builder

def main():
    run = Path(sys.argv[1]); rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
    rd = open_run(run, None, "compare", read_compare=False)
    spec = rd.spec
    table = json.loads((run / "compare.json").read_text())["range_table"]
    ok = sorted(t.id for t in rd.history if t.status == "ok")
    b = Builder(spec); b.variants = rd.variants
    w = Worker(spec, str(run / "rt-worker.log"))
    try:
        p = ranges.Prober(spec, b, w, {t.id: t for t in rd.history}, 4, 120)
        p.arms = {"compile": False, "arms": {}}
        shapes = []
        for r in table["ranges"]:
            lo, hi = r["lo"]["N"], r["hi"]["N"] - 1
            shapes.append(("public", r["point"]))
            for _ in range(3):
                while True:
                    n = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
                    if n & (n - 1):
                        break
                shapes.append(("secret", spec.op.point({"N": n})))
        res = p.time([s for _, s in shapes], [ok] * len(shapes))
        for (kind, sh), got in zip(shapes, res):
            ent = table_use = ranges.lookup(table, sh, p.serves)
            cells = "  ".join(f"#{t}: {got[f'#{t}']['median']*1e6:7.1f} us{' ERR ' + str(got[f'#{t}']['error']) if got[f'#{t}']['error'] else ''}" for t in ok)
            print(f"{kind:6s} {sh['M']:5d}x{sh['N']:<5d} table takes #{ent}   {cells}   eager {got['torch eager']['median']*1e6:7.1f} us")
    finally:
        w.close()

if __name__ == '__main__':
    main()
