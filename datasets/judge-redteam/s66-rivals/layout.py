"""Where compare puts its buffers in the CPU host's arena (in-process Judge, Arena.alloc logged)."""
import secrets, sys, glob
from runner.build.backends import cpu_host
from runner.spec.spec import load_spec
from runner.judge.worker import Judge
log = []
orig = cpu_host.Arena.alloc
def alloc(self, n):
    off = orig(self, n); log.append((off, n)); return off
cpu_host.Arena.alloc = alloc
root = sys.argv[1]
spec = load_spec(root + "/spec.yaml")
j = Judge(spec)
arts = sorted(glob.glob(root + "/cache/**/*.so", recursive=True))
print(arts[:4])
from runner.build.builder import Builder
geo = Builder(spec).geometry({"HACK": "honest"})
job = {"seed": 1, "rounds": 2, "eager": False, "compile": False, "arms": {}, "copy": False,
       "candidates": [[{"label": "a", "trial": 0, "artifact": arts[0], "geometry": geo[0]},
                       {"label": "b", "trial": 0, "artifact": arts[1], "geometry": geo[0]}], []],
       "shapes": [spec.op.shapes[0]]}
log.clear()
r = j.compare(job)
for off, n in log[:12]: print(off, n)
print({k: v["error"] for k, v in r["shapes"][0].items()})
