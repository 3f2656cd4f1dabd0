"""Compile-only checks of the decode-attention specs (issue 21) on a machine without a GPU.

    python tools/attn_check.py            # every configuration: render, source rules, NVRTC
    python tools/attn_check.py --nvcc     # ... and the local nvcc for sm_90a
    python tools/attn_check.py --paged    # the paged specs (pages of 16 and 64 tokens) instead
    python tools/attn_check.py --spec A.yaml --spec B.yaml

For pipelines/decode-attention-h200.yaml (the default) or the specs given: the template reads
no size (B, and L or MAXP, nor a derived value that depends on them) and renders the same
source for two shapes; every configuration passes the forbidden-source rules and compiles with
NVRTC through pipe's Builder (sm_90) with no spills and within the launch limits at its shared
memory (the runner's prune); with --nvcc also with nvcc -gencode=arch=compute_90a,code=sm_90a,
no spills. Every (B, context) of a dense sample of the domain is served by some configuration.
Prints registers and shared memory per configuration family. Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

SPEC = ROOT / "pipelines/decode-attention-h200.yaml"
PAGED = [ROOT / "pipelines/decode-attention-paged16-h200.yaml", ROOT / "pipelines/decode-attention-paged64-h200.yaml"]
FAILURES: list[str] = []


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print(f"FAIL {msg}", flush=True)


def label(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("HKV", "GROUP"))


def context_symbol(sp) -> str:
    """The context's size: L (contiguous, tokens) or MAXP (paged, pages a sequence)."""
    (ctx,) = [x for x in sp.op.symbols if x != "B"]
    return ctx


def context_sample(lo: int, hi: int) -> list[int]:
    """Powers of two, their neighbours and three times them, inside [lo, hi], and the ends."""
    xs = {lo, hi, *(x for e in range(0, 18) for x in ((1 << e) - 1, 1 << e, (1 << e) + 1, 3 << e))}
    return sorted(x for x in xs if lo <= x <= hi)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", action="append", default=[], help="a spec (repeatable; default the contiguous one)")
    ap.add_argument("--paged", action="store_true", help="the paged specs (pages of 16 and 64 tokens)")
    ap.add_argument("--nvcc", action="store_true")
    a = ap.parse_args()
    specs = [Path(x) for x in a.spec] + (PAGED if a.paged else [])
    for path in specs or [SPEC]:
        check(path, a.nvcc)
    print(f"{len(FAILURES)} failures")
    return 1 if FAILURES else 0


def check(path: Path, nvcc: bool) -> None:
    from runner.build import render
    from runner.spec.spec import load_spec
    from space_check import compile_space, nvcc_all

    sp = load_spec(path)
    ctx = context_symbol(sp)
    k = sp.kernel
    symbols = set(sp.op.symbols)
    used = render.template_variables(k.template)
    if used & symbols:
        fail(f"the template reads the shape symbols {sorted(used & symbols)}")
    deps: dict[str, set] = {}
    for name, e in k.derive:
        deps[name] = set(e.names) & symbols
        for n2 in e.names:
            deps[name] |= deps.get(n2, set())
    for name in sorted(used & set(deps)):
        if deps[name]:
            fail(f"the template reads derived value {name}, which depends on {sorted(deps[name])}")

    configs = list(sp.space)
    print(f"{sp.name}: {len(configs)} configurations")

    # coverage: every (B, context) of a sample of the domain served by some configuration
    dom = sp.op.domain[ctx]
    Ls = context_sample(dom.min, dom.max)
    served = defaultdict(int)
    for L in Ls:
        for cfg in configs:
            if k.serves_shape(cfg, {"B": 1, ctx: L}, 2):
                served[L] += 1
        if not served[L]:
            fail(f"{ctx}={L} served by no configuration")
    print(f"  configurations serving {ctx}: " + ", ".join(f"{L}: {served[L]}" for L in Ls if L & (L - 1) == 0))

    t0 = time.time()
    b, compiled, owners = compile_space(sp, configs, [{"B": 1, ctx: dom.min}, {"B": 16, ctx: dom.max - 1}],
                                        {"B": 3, ctx: dom.max // 32 + 3}, fail, label)
    table = [(cfg, c.resources.get("registers", 0), k.derived({"B": 1, ctx: dom.min, **cfg})["RING"])
             for cfg, c in compiled]
    regs = [r for _, r, _ in table]
    print(f"  {len(owners)} distinct sources compiled with NVRTC ({b.backend.toolchain()}, {sp.hw.arch}) in "
          f"{time.time() - t0:.0f} s; registers {min(regs, default=0)} .. {max(regs, default=0)}")
    fam = defaultdict(list)  # registers by (NW, TW, VEC); SPLIT and STAGES change little
    for cfg, r, smem in table:
        fam[(cfg["NW"], cfg["TW"], cfg["VEC"])].append((r, smem))
    print(f"  {'NW':>3} {'TW':>3} {'VEC':>3}  registers      dynamic shared memory (KiB, by STAGES)")
    for key in sorted(fam):
        rs = [r for r, _ in fam[key]]
        sm = sorted({s for _, s in fam[key]})
        print(f"  {key[0]:>3} {key[1]:>3} {key[2]:>3}  {min(rs):>3} .. {max(rs):<3}     "
              + ", ".join(f"{s / 1024:.1f}" for s in sm))

    if nvcc:
        nvcc_all(owners, fail, label)

if __name__ == "__main__":
    sys.exit(main())
