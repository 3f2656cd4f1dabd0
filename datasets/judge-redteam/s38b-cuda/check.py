"""Build every session-38b CUDA red-team variant through runner.build.builder.Builder against its
shipped spec (forbidden list unchanged) at the spec's first start configuration, and print
accepted/refused with the reason. Each variant is also built in its canonical spelling (the same
instructions without the reader trick): those must be refused, which shows the rule the trick
gets past is in force. No GPU needed (NVRTC only).

    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s38b-cuda/check.py [--all-starts]
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


from cuda_build import build, builder, evidence, verdict  # noqa: E402,F401
from make_variants import variants  # noqa: E402

# the same edits with the instructions spelled the ordinary way (each trick undone)
CANON = (("// end inline asm\\n\\t", ""), ("\\n\\t// begin inline asm", ""), ('\\x2e" "', '." "'),
         ("\\n\\t.loc 1 1 1\\n\\t", "\\n\\t"), ("%%pipe: ", ""), ("%%m1: ", ""), ("%%m2: ", ""),
         (".extern.func", ".extern .func"), ("call.uni(), free", "call.uni free"), ("call.uni(", "call.uni ("),
         ("L2::cache_hint.bf16x2 [%0], %1, %2;", "bf16x2 [%0], %1;"))


def canonical(text: str) -> str:
    """The variant without its trick: must be refused."""
    for a, b in CANON:
        text = text.replace(a, b)
    return text





# what each variant's PTX must hold (so an acceptance is not vacuous): read from the cached PTX
EVIDENCE = {"w1": r"ex2\.approx\.ftz\.f32|rcp\.approx\.ftz\.f32", "w2": r"rsqrt\.approx\.ftz\.f32",
            "w3": r"ex2\.approx\.ftz\.f32", "w4": r"\.loc 1 1 1\s+(ex2|rcp)\.approx\.ftz",
            "w5": r"mma\.sync\.aligned\.m16n8k32\.row\.col\.f32\.e4m3", "w6": r"%pipe: cvta\.const",
            "w7": r"%m1: mul\.rn\.bf16x2", "w8": r"call\.uni\(r0\), malloc", "w9": r"red\.global\.add\.noftz\.L2::cache_hint\.bf16x2"}


def evidence(name: str, spec: str, text: str, params: dict) -> str:
    import re

    ev = builder(spec)
    vid = f"e{len(ev.variants)}"
    ev.variants[vid] = text
    arts, _ = ev.compiled(ev.render_all(params, vid))
    rx = EVIDENCE[name[:2]]
    n = sum(len(re.findall(rx, Path(a).with_suffix(".ptx").read_text())) for a in dict.fromkeys(arts or []))
    return f"{n} match(es) of /{rx}/ in the accepted build's PTX"



def main() -> int:
    all_starts = "--all-starts" in sys.argv
    bad = 0
    for name, (spec, cls, text) in variants().items():
        on_disk = HERE / name
        if on_disk.exists():
            text = on_disk.read_text()
        ev = builder(spec)
        starts = ev.spec.starts if all_starts else ev.spec.starts[:1]
        for k, start in enumerate(starts):
            b = build(spec, text, start)
            c = build(spec, canonical(text), start)
            print(f"{name} [{spec} start {k}, {cls}]\n  variant:   {verdict(b)}\n  canonical: {verdict(c)}\n"
                  f"  evidence:  {evidence(name, spec, text, start)}")
            bad += b.status != "ok" or (c.status == "ok" and canonical(text) != text)
    print("all variants accepted and their canonical spellings refused" if not bad else f"{bad} unexpected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
