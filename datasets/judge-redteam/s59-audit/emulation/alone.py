import sys
sys.path.insert(0, "/tmp/audit2")
from tests.test_batch_invariant import spec_data, write
from runner.spec.spec import load_spec
from runner.judge import invariance
import tempfile, pathlib
d = pathlib.Path(tempfile.mkdtemp())
sp = load_spec(write(d, spec_data("B")))
shapes = list(sp.op.all_shapes)
print(shapes)
for s in range(6):
    plan = invariance.plan("B", shapes, s)
    print(s, [(c["index"], [(sub["shape"], invariance.describe(sub)) for sub in c["subs"]]) for c in plan])
