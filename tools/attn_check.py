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
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "pipelines/decode-attention-h200.yaml"
PAGED = [ROOT / "pipelines/decode-attention-paged16-h200.yaml", ROOT / "pipelines/decode-attention-paged64-h200.yaml"]
FAILURES: list[str] = []


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print(f"FAIL {msg}", flush=True)


def label(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("HKV", "GROUP"))


def _nvcc_one(args):
    src, tmpdir = args
    import hashlib

    cu = Path(tmpdir) / f"{hashlib.sha256(src.encode()).hexdigest()[:16]}.cu"
    cu.write_text(src)
    p = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-cubin",
                        "-Xptxas", "-v", "-o", str(cu.with_suffix(".cubin")), str(cu)],
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


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
    from runner.build.builder import Builder
    from runner.spec.spec import load_spec

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

    b = Builder(sp)
    sources, owners = [], {}
    t0 = time.time()
    for cfg in configs:
        try:
            s1, s2 = b.render_all(cfg, shapes=[{"B": 1, ctx: dom.min}, {"B": 16, ctx: dom.max - 1}])
        except Exception as e:  # noqa: BLE001
            fail(f"{label(cfg)}: render: {e}")
            continue
        if s1 != s2:
            fail(f"{label(cfg)}: the source depends on the shape")
        v = b.source_rules(s1)
        if v:
            fail(f"{label(cfg)}: forbidden: {v}")
        owners.setdefault(s1, []).append(cfg)
        if len(owners[s1]) == 1:
            sources.append(s1)
    comp = b._compile_all(sources)
    table = []
    for src, c in zip(sources, comp):
        cfg = owners[src][0]
        if not c.ok:
            fail(f"{label(cfg)}: {c.status}: {c.reason}")
            continue
        res = c.resources
        if res.get("spill_stores") or res.get("spill_loads") or res.get("stack_bytes"):
            fail(f"{label(cfg)}: spills ({res})")
        geo = b.geometry(cfg, [{"B": 3, ctx: dom.max // 32 + 3}])[0]
        why = b.backend.prune(res, geo, sp.hw, False)
        if why:
            fail(f"{label(cfg)}: pruned: {why}")
        ext = set((c.ptx or {}).get("extern", {})) - {"__assertfail", "vprintf"}
        if ext:
            fail(f"{label(cfg)}: calls external functions {sorted(ext)}")
        smem = k.derived({"B": 1, ctx: dom.min, **cfg})["RING"]
        table.append((cfg, res.get("registers", 0), smem))
    regs = [r for _, r, _ in table]
    print(f"  {len(sources)} distinct sources compiled with NVRTC ({b.backend.toolchain()}, {sp.hw.arch}) in "
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
        t0 = time.time()
        tmpdir = tempfile.mkdtemp(prefix="attn_nvcc_")
        with ProcessPoolExecutor(max_workers=max(1, os.cpu_count() or 2)) as pool:
            out = list(pool.map(_nvcc_one, [(s, tmpdir) for s in sources]))
        nregs = []
        for src, (rc, log) in zip(sources, out):
            who = label(owners[src][0])
            if rc:
                fail(f"{who}: nvcc sm_90a failed: {log.strip().splitlines()[-1] if log.strip() else rc}")
                continue
            m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
            if m and any(int(x) for x in m.groups()):
                fail(f"{who}: nvcc sm_90a spills: {m.group(0)}")
            m = re.search(r"Used (\d+) registers", log)
            if m:
                nregs.append(int(m.group(1)))
        print(f"  {len(sources)} sources compiled with nvcc sm_90a in {time.time() - t0:.0f} s; "
              f"registers {min(nregs, default=0)} .. {max(nregs, default=0)}")


if __name__ == "__main__":
    sys.exit(main())
