"""rmsnorm-h200's honest rewrite 1/sqrtf for rsqrtf (session 46's probe), n times, with the tree's
SUBNORMAL_BACKENDS as it is: python3 divsqrt.py OUT_DIR [N]"""
import importlib.util
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
s = importlib.util.spec_from_file_location("s46", here.parent / "s46-precision" / "probe.py")
m = importlib.util.module_from_spec(s)
s.loader.exec_module(m)
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
    m.run(Path(sys.argv[1]) / str(i), ("rmsnorm-h200",),
          lambda n, t: {k: v for k, v in m.variants(n, t).items() if k in ("honest-div-sqrt", "control")})
