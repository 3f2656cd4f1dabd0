import json, sys
t = {}
for f in sys.argv[1:]:
    t.update(json.load(open(f)))
for tell, checks, shapes in (("dup", 2, range(5)), ("near", 2, range(5)), ("weight", 2, range(5)),
                             ("outlier", 12, range(5)), ("bulk", 12, range(5))):
    tot = 0
    per = []
    for turn in range(6):
        miss = 1.0
        for si in shapes:
            for r in range(checks):
                miss *= 1 - t[f"{si}:{(turn + si + r) % 6}"][tell]
        per.append(miss)
        tot += miss / 6
    print(f"{tell:8s} checks={checks:2d} P(miss per run)={tot:.2e}  by turn%6: " + " ".join(f"{m:.1e}" for m in per))
