"""Finding C (code-level, not shown end to end): cut_slow_at_curve looks for the kernel the
table picked only in the list of the entry holding the point (a level row, or the range), but
lookup/level_order reach the kernel through the level's list, then the lists of the levels
above, then the range's main list. A kernel picked at a secret point through the chain (the
level's own kernel does not serve that size) is never cut, and stays picked.
    python levels_cut.py   (from /work/main with the venv active, or PYTHONPATH=/work/main)"""
import copy, sys
sys.path.insert(0, "/work/main")
from runner.ship import ranges

# one range on N with a `rows` level for few rows (as rmsnorm-range-cpu's M: tune [2^18/N, 4]):
# the level (M < 197) lists #1 (ACC=32: serves N >= 128), the main list #2 (serves every N)
table = {"axes": ["N"], "levels": "M", "exact": [],
         "ranges": [{"lo": {"N": 91}, "hi": {"N": 182}, "point": {"M": 2048, "N": 128}, "use": [2],
                     "rows": [{"below": 197, "point": {"M": 4, "N": 128}, "use": [1]}]}]}
serves = lambda tid, shape: shape["N"] >= 128 if tid == 1 else True
shape = {"M": 9, "N": 101}  # a secret point of the few-rows quarter, below the level's cut
pick = ranges.lookup(table, shape, serves)
print("table's pick at", shape, "->", f"#{pick}")
# the curve's row: #2 slower than torch eager in every round, by 60% to 90%
rows = [{"shape": shape, "use": f"#{pick}", "vs_fallback": {"arm": "torch eager", "range": [0.6, 0.9]}}]
before = copy.deepcopy(table)
cuts = ranges.cut_slow_at_curve(table, rows)
print("cut_slow_at_curve ->", cuts, "| table changed:", table != before)
print("the table's pick there afterwards ->", f"#{ranges.lookup(table, shape, serves)}")
# the same point with #2 on the level's own list is cut, for contrast
t2 = copy.deepcopy(before); t2["ranges"][0]["rows"][0]["use"] = [2]
print("control (level lists #2 itself):", ranges.cut_slow_at_curve(t2, copy.deepcopy(rows)),
      "-> pick", ranges.lookup(t2, shape, serves))
