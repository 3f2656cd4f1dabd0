"""Build every session-38 CUDA red-team variant through runner.build.builder.Builder against its
shipped spec (forbidden list unchanged) at the spec's first start configuration, and print
accepted/refused with the reason. Each variant is also built in its canonical spelling (the same
instructions without the whitespace trick): those must be refused, which shows the rule the trick
gets past is in force. No GPU needed (NVRTC only).

    cd /work/main && . .venv/bin/activate && python datasets/judge-redteam/s38-cuda/check.py [--all-starts]
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

# the same edits with the instructions spelled the ordinary way
CANON = (('ex2 ." "approx', 'ex2." "approx'), ('\\n\\t." "approx', '." "approx'), ("@ p ex2", "@p ex2"),
         ("cvta .const", "cvta.const"), ("mul .rn.bf16x2", "mul.rn.bf16x2"), ("cvt .rn.satfinite", "cvt.rn.satfinite"),
         ("mma .sync.aligned.m16n8k32", "mma.sync.aligned.m16n8k32"),
         ("\\n\\t.extern\\n\\t.func", "\\n\\t.extern .func"))


def canonical(text: str) -> str:
    """The variant without its trick. v9 has none to undo (dp4a is no classified opcode), so its
    'canonical' form is itself and it is reported as accepted both ways."""
    for a, b in CANON:
        text = text.replace(a, b)
    return text






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
            print(f"{name} [{spec} start {k}, {cls}]\n  variant:   {verdict(b)}\n  canonical: {verdict(c)}")
            bad += b.status != "ok" or (c.status == "ok" and canonical(text) != text)
    print("all variants accepted and their canonical spellings refused" if not bad else f"{bad} unexpected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
