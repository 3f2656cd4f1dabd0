"""How the rules read each accepted variant (rendered for shape 0, as the trial does): strip_comments
(the raw-text rules) and pcpp (the expanded-text rules, NVRTC's macros) - the payload is in neither."""
import sys
from pathlib import Path
from runner.build import forbid
from runner.build.backends import cuda
from runner.build.builder import Builder
from runner.spec.spec import load_spec
sp = load_spec("pipelines/softmax-h200.yaml"); b = Builder(sp)
for f in sys.argv[1:]:
    b.variants["x"] = Path(f).read_text()
    s = b.render_all(dict(sp.starts[0]), "x", [sp.op.shapes[0]])[0]
    c = forbid.strip_comments(s)
    e = forbid.preprocess(s, forbid.nvrtc_macros("sm_90", cuda.nvrtc_version()))
    print(Path(f).name, "| __fdividef in source:", "__fdividef" in s, "| in rules' text:", "__fdividef" in c,
          "| in pcpp text:", "__fdividef" in e)
    i = c.find("static_assert(")
    print("   rules read:", repr(c[i:i + 80]))
