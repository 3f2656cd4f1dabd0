"""Scratch probe: compile a snippet with NVRTC (the project's backend), print the classified PTX
counts (ptx.analyze) and the SASS classes (sass.analyze). Usage: python probe.py FILE.cu [arch]"""
import sys, json
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner.spec.spec import load_spec
from runner.build.backends import cuda
from runner.build import ptx, sass, forbid
spec = load_spec(Path(__file__).resolve().parents[1] / "pipelines/moe-coarse-h200.yaml")
src = Path(sys.argv[1]).read_text()
opts = tuple(sys.argv[2:]) or ("--arch=sm_90a",)
v = forbid.check_source(src, opts, "cuda", spec.forbidden.named, [])
print("source rules:", v)
c = cuda.compile(src, "k", opts, spec.hw)
print("ok:", c.ok, c.reason[:2000] if not c.ok else "")
if c.ok:
    a = ptx.analyze(Path(c.artifact).with_suffix(".ptx").read_text())
    print("ptx:", json.dumps(a))
    s = sass.analyze(sass.disassemble(c.artifact))
    print("sass:", json.dumps(s))
