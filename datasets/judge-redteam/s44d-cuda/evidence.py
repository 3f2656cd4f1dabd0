"""For each variant: the forbidden construct's count in its build's PTX and SASS against the approved
build's (same parameters, shape 0), from the same NVRTC builds the judge makes."""
import re, sys
from collections import Counter
from pathlib import Path
from runner.spec.spec import load_spec
from runner.build.builder import Builder
from runner.build import sass
sp = load_spec("pipelines/softmax-h200.yaml")
b = Builder(sp)
params = dict(sp.starts[0])
shape = sp.op.shapes[0]
RX = r"\b(?:ex2|lg2|div|rcp|rsqrt)\.approx[.\w]*|\b(?:add|fma|mul|cvt)\.r[zmp]\.[\w.]+|\bmul\.ftz\.f32|\bcvt\.rni\.s32\.f32|\band\.b32|\bshr\.u32|\bprmt\.b32|\blop3\.b32|\bcvt\.rn\.bf16x2\.f32"
SRX = r"\bMUFU\.\w+|\bF(?:ADD|FMA|MUL)\.(?:RZ|RM|RP|FTZ)\b|\bF2FP\.BF16\.F32\.PACK_AB\b|\bF2I\.\w+|\bLOP3\.LUT\b|\bPRMT\b"
def counts(text):
    src = text
    b.variants["x"] = src
    s = b.render_all(params, "x", [shape])[0]
    c = b._compile_all([s])[0]
    ptx = Path(c.artifact).with_suffix(".ptx").read_text()
    return Counter(re.findall(RX, ptx)), Counter(re.findall(SRX, sass.disassemble(c.artifact)))
bp, bs = counts(sp.kernel.template)
print("approved build: PTX", dict(sorted(bp.items())), "\n                SASS", dict(sorted(bs.items())))
for f in sys.argv[1:]:
    p, s = counts(Path(f).read_text())
    dp = {k: f"{bp.get(k,0)}->{v}" for k, v in sorted({**{k: 0 for k in bp}, **p}.items()) if v != bp.get(k, 0)}
    ds = {k: f"{bs.get(k,0)}->{v}" for k, v in sorted({**{k: 0 for k in bs}, **s}.items()) if v != bs.get(k, 0)}
    print(f"{Path(f).name}: PTX {dp}\n    SASS {ds}")
