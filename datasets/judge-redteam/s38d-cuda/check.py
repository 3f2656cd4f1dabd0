"""Build every session-38d CUDA red-team variant through runner.build.builder.Builder against its
shipped spec (forbidden list unchanged) at the spec's first start configuration (moe: the wgmma_tma
path's parameters over it), and print accepted/refused with the reason. Each variant is also built
in its canonical spelling (the same forbidden action in the form the judge classifies): those must
be refused, which shows the rule in force. The accepted build's PTX is grepped for the forbidden
instruction, so no acceptance is vacuous. No GPU needed (NVRTC only).

    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s38d-cuda/check.py
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


from cuda_build import build, builder, evidence, verdict  # noqa: E402,F401
from make_variants import variants  # noqa: E402







def main() -> int:
    bad = 0
    for name, v in variants().items():
        text = (HERE / name).read_text() if (HERE / name).exists() else v["text"]
        ev = builder(v["spec"])
        params = {**ev.spec.starts[0], **v["params"]}
        b = build(v["spec"], text, params)
        c = build(v["spec"], v["canon"], params)
        print(f"{name} [{v['spec']}, {v['cls']}]\n  variant:   {verdict(b)}\n  canonical: {verdict(c)}")
        if b.status == "ok":
            print(f"  evidence:  {evidence(v['spec'], text, params, v['evidence'])}")
        bad += b.status != "ok" or c.status == "ok"
    print("all variants accepted and their canonical spellings refused" if not bad else f"{bad} unexpected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
