"""The instruction mix of one configuration's kernel, from its SASS: what a thread issues,
by opcode and by pipe, and the issue-bound and MUFU-bound time of one pass over the row
units a block holds at once. Needs no GPU: the runner's own NVRTC build (sm_90 for the
h200 profile), disassembled by cuobjdump (`pip install 'pipe-autoresearch[cuda]'`,
or a CUDA toolkit's).

    python tools/sass_mix.py pipelines/softmax-h200.yaml 4096x32768 \\
        '{"EPT": 64, "TMAX": 512, "MINB": 1, "VEC": 8, "HOLD": "ring", "LOAD": "default", "STORE": "default"}' \\
        [--variants real,cheap-exp,no-reduce,bare] [--template OTHER.cu.j2] [--json out.json]

Counts are static: a loop the compiler did not unroll counts once. "instr" is the whole
kernel (set-up and cold paths included); "loop" is what lies inside its widest backward
branch, for a persistent kernel one row unit's work (the flagship templates unroll
everything inside a row unit). The pipe columns and the estimates are of the loop where
there is one, else of the kernel: a block's warps issuing 4 warp instructions a clock and
16 MUFU operations a clock (sm_90), at the profile's SM clock.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIPES = {
    "mufu": ("MUFU",),
    "fp32": ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "FCHK", "F2FP", "F2F", "FRND", "HFMA2", "HADD2", "HMUL2"),
    "int": ("IMAD", "IADD3", "LOP3", "SHF", "LEA", "ISETP", "SEL", "PRMT", "IABS", "IMNMX", "POPC", "FLO", "I2F", "F2I"),
    "memory": ("LDS", "STS", "LDG", "STG", "LDGSTS", "LDGDEPBAR", "DEPBAR", "LDSM", "UBLKCP", "SYNCS", "LD", "ST",
               "ATOMS", "ATOMG", "RED", "LDC"),
    "sync": ("BAR", "SHFL", "WARPSYNC", "UCGABAR_ARV", "UCGABAR_WAIT", "CCTL", "MEMBAR", "ERRBAR", "FENCE"),
}
_LINE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def sass(cubin: str) -> str:
    """The SASS text of a cubin (the judge's own disassembler: runner.build.sass)."""
    from runner.build import sass as reader

    try:
        return reader.disassemble(cubin)
    except RuntimeError as e:
        raise SystemExit(str(e))


def mix(sass: str) -> collections.Counter:
    ops = collections.Counter()
    for line in sass.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) not in ("NOP",):
            ops[m.group(1)] += 1
    return ops


_ADDR = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*)")


def main_loop(sass: str) -> tuple[int, collections.Counter]:
    """The instructions inside the widest backward branch (a persistent kernel's loop over
    its row units): what one row unit costs, without the set-up and the cold paths laid
    out after the loop. (0, empty) when the kernel has no loop."""
    rows = []
    for line in sass.splitlines():
        m = _ADDR.match(line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2), m.group(3)))
    best = None
    for addr, op, args in rows:
        t = re.search(r"0x([0-9a-f]+)\s*$", args.strip()) if op.startswith("BRA") else None
        if t and int(t.group(1), 16) < addr and (best is None or addr - int(t.group(1), 16) > best[1] - best[0]):
            best = (int(t.group(1), 16), addr)
    ops = collections.Counter()
    if best:
        for addr, op, _ in rows:
            if best[0] <= addr <= best[1] and op != "NOP":
                ops[op.split(".")[0]] += 1
    return sum(ops.values()), ops


def by_pipe(ops: collections.Counter) -> dict[str, int]:
    out = {k: 0 for k in (*PIPES, "other")}
    for op, n in ops.items():
        out[next((k for k, v in PIPES.items() if op in v), "other")] += n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("shape", help="sizes joined by x, in the order of the spec's symbols")
    ap.add_argument("config", help="a parameter fill: JSON or NAME=V,... (the rest take the spec's start)")
    ap.add_argument("--variants", default="real", help="benchmarks/anatomy.py variants, joined by commas")
    ap.add_argument("--template", type=Path, help="render this template instead of the spec's (an older version)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from runner.build.backends import cuda
    from runner.spec.spec import load_spec
    from runner.build.builder import Builder

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import anatomy  # its variants and its shape parsing

    spec = load_spec(str(a.spec))
    builder = Builder(spec)
    symbols = list(spec.op.symbols)
    shape = anatomy.parse_shape(a.shape, symbols)
    params = anatomy.parse_config(a.config, spec.space, spec.start)  # JSON or NAME=V,...; the rest the start's
    variant = None
    if a.template:  # rendered as the spec's template is, from the spec's derived values
        builder.variants["other"] = a.template.read_text()
        variant = "other"
    src = builder.render_all(params, variant, shapes=[shape])[0]
    geo = builder.geometry(params, shapes=[shape])[0]
    threads = 1
    for d in geo["block"]:
        threads *= d
    warps = (threads + 31) // 32
    clock = float(spec.hw.get("clock_mhz", 1980)) * 1e6
    out = {"spec": str(a.spec), "shape": shape, "config": params, "geometry": geo, "variants": {}}
    print(f"geometry {geo}; {warps} warps a block")
    print(f"{'variant':10s} {'regs':>4s} {'instr':>6s} {'loop':>5s} " + " ".join(f"{k:>6s}" for k in (*PIPES, "other"))
          + f" {'issue us':>9s} {'mufu us':>8s}")
    for v in [x.strip() for x in a.variants.split(",") if x.strip()]:
        c = cuda.compile(anatomy.variant_source(src, v), spec.kernel.entry, spec.kernel.options, spec.hw)
        if not c.ok:
            print(f"{v:10s} compile error: {c.reason}")
            continue
        text = sass(c.artifact)
        ops = mix(text)
        total = sum(ops.values())
        loop, lops = main_loop(text)
        # a row unit's cost: the persistent kernels' loop where there is one, else the kernel
        unit, uops = (loop, lops) if loop else (total, ops)
        pipes = by_pipe(uops)
        # a block's warps share the SM's 4 schedulers (one block an SM for the persistent kernels)
        issue_us = warps * unit / 4 / clock * 1e6
        mufu_us = threads * uops.get("MUFU", 0) / 16 / clock * 1e6
        print(f"{v:10s} {c.resources.get('registers', 0):4d} {total:6d} {loop:5d} "
              + " ".join(f"{pipes[k]:6d}" for k in pipes) + f" {issue_us:9.2f} {mufu_us:8.2f}")
        out["variants"][v] = {"resources": c.resources, "total": total, "loop": loop, "pipes": pipes,
                              "ops": dict(ops.most_common()), "loop_ops": dict(lops.most_common()),
                              "issue_us": issue_us, "mufu_us": mufu_us}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
