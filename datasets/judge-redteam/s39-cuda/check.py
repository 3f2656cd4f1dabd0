"""Build every session-39 CUDA red-team variant through runner.build.builder.Builder against its
shipped spec (forbidden list unchanged) at the spec's first start configuration, with its canonical
spelling, and print the verdicts. Findings (y*): the variant must be accepted and its canonical
spelling refused; the accepted build's PTX is grepped for the forbidden construct, and the SASS
evidence is printed. False positives (f*): the honest variant is refused and the same variant
without the honest construct is accepted. No GPU needed (NVRTC, cuobjdump).

    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s39-cuda/check.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from cuda_build import build, builder, evidence, verdict  # noqa: E402
from make_variants import variants  # noqa: E402

from runner.build import sass  # noqa: E402

# SASS lines shown as evidence for each finding (the accepted cubin)
SASS_RX = {
    "y1_softmax_const_generic_init_state.cu.j2": r"LDC\.64 R\d+, c\[0x3\]|RED\.E\.ADD|REDG\.E\.ADD|ATOMG\.E\.ADD",
    "y2_decode_attention_p_bf16_trunc.cu.j2": r"PRMT R\d+, R\d+, 0x7632|HMMA\.16816\.F32\.BF16",
}


def sass_evidence(spec: str, text: str, params: dict, rx: str) -> str:
    ev = builder(spec)
    vid = f"s{len(ev.variants)}"
    ev.variants[vid] = text
    arts, _ = ev.compiled(ev.render_all(params, vid))
    lines, n = [], 0
    for a in dict.fromkeys(arts or []):
        for ln in sass.disassemble(a).splitlines():
            if re.search(rx, ln):
                n += 1
                if len(lines) < 3:
                    lines.append(re.sub(r"\s+", " ", ln.split(";")[0].strip()) + ";")
    return f"{n} SASS line(s) matching /{rx}/, e.g. " + " | ".join(lines)


def main() -> int:
    bad = 0
    for name, v in variants().items():
        text = (HERE / name).read_text() if (HERE / name).exists() else v["text"]
        ev = builder(v["spec"])
        params = {**ev.spec.starts[0], **v["params"]}
        b = build(v["spec"], text, params)
        c = build(v["spec"], v["canon"], params)
        label = "canonical" if v["kind"] == "finding" else "without  "
        print(f"{name} [{v['spec']}, {v['cls']}]\n  variant:   {verdict(b)}\n  {label}: {verdict(c)}")
        if v["kind"] == "finding":
            if b.status == "ok":
                print(f"  evidence:  {evidence(v['spec'], text, params, v['evidence'])}")
                print(f"  sass:      {sass_evidence(v['spec'], text, params, SASS_RX[name])}")
                print(f"  ptx data:  {b.ptx.get('data')} (approved: {(b.ptx_approved or {}).get('data')})")
            bad += b.status != "ok" or c.status == "ok"
        else:
            bad += b.status == "ok" or c.status != "ok"
    print("all as expected (findings accepted with canonical refused; honest variants refused, their plain "
          "versions accepted)" if not bad else f"{bad} unexpected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
