"""What run-time row lengths cost on the long rows, on one GPU and in one process.

At each size N (M * N = 2^27 unless --rows), three kinds of kernel are timed side by side with
the L2 flushed, beside a device copy of the same bytes:
- the fixed-size flagship's kernels (`pipelines/OP-h200.yaml`, N compiled in): softmax's tma hold
  (the bulk-copy ring, 0.90 of copy at 1024x131072) and streaming hold (the row read twice);
  RMSNorm's ring, register and streaming holds;
- the run-time template's long-row configurations (`pipelines/OP-range-h200.yaml`; softmax PF 3
  and 4, RMSNorm PF 1, 2, 3 and 4 unless --pf) that serve N, as the range runs build them;
- the same run-time configurations with N compiled in: the rendered source's N argument renamed
  and N declared a constant, so that the compiler folds the row's cut as the flagship's does.

If the run-time configurations with N compiled in reach the flagship's time, the cost is the
run-time arithmetic; if they stay where the run-time ones are, it is the structure (piece size,
ring depth, grid). Every kernel with N compiled in is verified against the float64 reference
at its N before it is timed. Softmax's PF 3 can also be timed with other slots (--slot) and with
parts of its cut made constant (--patch), to bisect what the run-time N costs.

--ablate times PF 3 (both ops) with parts of a row's chain taken out, to see what the chain's
time is made of: "noexp" (softmax's exponential a subtraction: no MUFU), "nopair" (no cluster
exchange: each block scales by its own statistics), "noreduce" (no block reductions: no named
barriers), "nostore" (the whole chunks' stores behind a predicate that never holds), joined by /
(e.g. noexp/nopair/noreduce: the ring, the loads and the stores alone; / and not +, which
tools/device-run.sh turns into commas). These kernels compute
wrong rows by construction: they are timed, never verified, and are probes, not candidates
(plain or streaming stores, ALIGN 0 and LAG 0 only; EXPOLY 0 and FUSE 0 for noexp).

--ncu W1/W2 launches each kernel whose kind and label hold every word once more after the
timings, inside the profiler's range and an NVTX range named after it: under tools/device-run.sh's
`ncu:` step, Nsight Compute's sections (warp states among them) for those launches alone, e.g.
`ncu:tools/fixed_n_probe.py:--sizes,262144,--pf,3,--ablate,nostore,--ncu,nostore/CL=8`.

--offset E times every kernel (and the copy) a second time with x and y moved E elements past a
512-byte boundary (the weight stays put): the same N, the same cut, only where the rows' bytes
start. At E = 8 every row starts 16 bytes into a 32-byte sector; if that costs the kernels what
N = 131064 costs against 131072, the rows' alignment in memory is the cost, not N's arithmetic.

    python tools/fixed_n_probe.py [--op rmsnorm] --sizes 65536,131072,262144 [--rows M] [--top 4]
    python tools/fixed_n_probe.py --compile-only ...     # no GPU: render and compile every kernel
    python tools/fixed_n_probe.py --op rmsnorm --pf 3 --sizes 131072 --offset 8
"""
from __future__ import annotations

import argparse
import itertools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

SIGNATURE = "int N) {"  # the kernel's last argument (softmax: M, N; RMSNorm: M, eps, N)


def fix_n(src: str, n: int) -> str:
    """The source with the kernel's N argument ignored and N a compile-time constant."""
    at = src.find("__global__")  # the kernel's own signature: device functions take an N too
    i = src.find(SIGNATURE, at)
    if at < 0 or i < 0 or src.count("__global__") != 1:
        raise SystemExit(f"expected one kernel whose signature ends '{SIGNATURE}' in the rendered source")
    return src[:i] + f"int N_run) {{\n  constexpr int N = {n};" + src[i + len(SIGNATURE):]


CUT = "const Cut c = cut_of(N);"
SPAN = "s.off = (int)(start & 7);"


def patched(src: str, n: int, cfg: dict, which: str) -> str | None:
    """PF 3's source with part of what N decides made a constant (for bisecting what the
    run-time N costs): "cut", the launch's cut (P = PMAX chunks a part, SUBMAX pieces; only
    where N gives every block a full part); "span", rows on chunk boundaries (N % 8 == 0)."""
    out = src
    for w in which.split("+"):
        if w == "cut":
            from bulk_model import cut_of  # the template's cut, as the host model has it

            if cut_of(n, cfg["CL"], 1)[0] != cfg["TPR"] * cfg["ITEMS"] or out.count(CUT) != 1:
                return None
            out = out.replace(CUT, "Cut c = cut_of(N); c.P = PMAX; c.sub = SUBMAX;")
        elif w == "span":
            if n % 8 or out.count(SPAN) != 1:
                return None
            out = out.replace(SPAN, "s.off = 0;")
    return out


# What each ablation takes out of PF 3's rendered source: (op, [(old, new), ...]); every old text
# must occur exactly once (else the ablation does not apply to that source and is skipped).
ABLATIONS = {
    "noexp": {"softmax": [("{ return exp2f((v - m) * L2E); }", "{ return (v - m) * L2E; }")]},
    "nopair": {"softmax": [("cluster_pair<RPAIR>(m, s, clv, clb, rank, jc++);", "jc++;")],
               "rmsnorm": [("cluster_pair<RSUM>(unused, ss, clv, clb, rank, jc++);", "jc++;")]},
    "noreduce": {"softmax": [("block_reduce<RMAX>(m, s, red, jb++);", "jb++;"),
                             ("block_reduce<RSUM>(m, s, red, jb++);", "jb++;")],
                 "rmsnorm": [("block_reduce<RSUM>(unused, ss, red, jb++);", "jb++;")]},
    "nostore": {"softmax": [("store_y(yv + a + q, o);", "if (N < 0) store_y(yv + a + q, o);")],
                "rmsnorm": [("store_y(yv + qq, o);", "if (N < 0) store_y(yv + qq, o);")]},
}


def ablated(src: str, op: str, which: str) -> str | None:
    """PF 3's source with the parts of the chain named in `which` ("noexp/nopair", ...) taken out,
    or None where one of them does not apply (RMSNorm has no exponential; STORE bulk no plain
    store; LAG its own exchange)."""
    out = src
    for w in which.split("/"):
        if w not in ABLATIONS:
            raise SystemExit(f"--ablate: unknown part '{w}' (known: {', '.join(ABLATIONS)})")
        edits = ABLATIONS[w].get(op)
        if not edits:
            return None
        for old, new in edits:
            if out.count(old) != 1:
                return None
            out = out.replace(old, new)
    return out


def moved(t, off: int):
    """A copy of contiguous `t` that starts `off` elements past the start of a fresh buffer (the
    caching allocator's blocks start on 512-byte boundaries)."""
    import torch

    buf = torch.empty(t.numel() + max(off, 1), dtype=t.dtype, device=t.device)
    v = buf[off:off + t.numel()].view(t.shape)
    v.copy_(t)
    return v


def moved_pair(src, off: int):
    """(source, destination) of the copy: both `off` elements past a 512-byte boundary."""
    return moved(src, off), moved(src, off)


_MOVED: dict = {}


def timed_moved(gg, bb, cfg: dict, art: str, n: int, m: int, off: int) -> float:
    """Seconds of one configuration at M x N with x and y (the tensors of M * N elements) moved
    `off` elements; other inputs (RMSNorm's weight) as they are. The moved tensors are made once
    a size and offset."""
    shape, inputs, outs = gg.timing_inputs(n, m)
    key = (id(gg), n, m, off)
    if key not in _MOVED:
        _MOVED.clear()  # the last size's tensors go first
        _MOVED[key] = ({k: (moved(v, off) if v.numel() == m * n else v) for k, v in inputs.items()},
                       [moved(o, off) if o.numel() == m * n else o for o in outs])
    return gg.timed_on(bb, cfg, art, shape, *_MOVED[key])


def flagship_configs(op: str) -> list[dict]:
    """softmax: the flagship's tma holds around its 1024x131072 winner, and its streaming holds;
    RMSNorm: its rings around its 2048x65536 winner, and its register and streaming holds."""
    out = []
    if op == "rmsnorm":
        for ept, tmax, minb, vec, hold in itertools.product((32, 64), (512, 1024), (1, 2), (4, 8),
                                                            ("ring", "f32", "none")):
            out.append({"EPT": ept, "TMAX": tmax, "MINB": minb, "VEC": vec, "HOLD": hold, "LOAD": "default",
                        "STORE": "default"})
        return out
    for ept, tmax, minb, vec, store in itertools.product((32, 64), (256, 512), (1, 2), (4, 8), ("default", "bulk")):
        out.append({"EPT": ept, "TMAX": tmax, "MINB": minb, "VEC": vec, "HOLD": "tma", "LOAD": "default",
                    "STORE": store})
    for tmax in (512, 1024):
        out.append({"EPT": 64, "TMAX": tmax, "MINB": 1, "VEC": 8, "HOLD": "none", "LOAD": "default",
                    "STORE": "cs"})
    return out


def flabel(c: dict) -> str:
    return f"flagship HOLD={c['HOLD']} EPT={c['EPT']} TMAX={c['TMAX']} MINB={c['MINB']} VEC={c['VEC']} STORE={c['STORE']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="softmax", choices=("softmax", "rmsnorm"))
    ap.add_argument("--sizes", default="65536,131072,262144", help="row lengths (the flagship's tma hold: multiples of 8)")
    ap.add_argument("--rows", type=int, default=0, help="M of the timed shape (default M * N = 2^27)")
    ap.add_argument("--top", type=int, default=4, help="kernels listed a kind and size")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: render and compile only")
    ap.add_argument("--slot", type=int, default=0, help="also PF 3 with slots of this many bytes (e.g. 8192)")
    ap.add_argument("--patch", default="", help="PF 3 with parts of N's cut constant: cut, span, cut+span")
    ap.add_argument("--ablate", default="",
                    help="PF 3 with parts of the chain out (timed, never verified): noexp, nopair, noreduce, "
                         "nostore, joined by / and listed with commas")
    ap.add_argument("--pf", default="", help="the run-time template's PF values (softmax 3,4; RMSNorm 1,2,3,4)")
    ap.add_argument("--ncu", default="",
                    help="after the timings, one launch of each kernel whose kind and label hold every one of "
                         "these words (joined by /, e.g. nostore/CL=8), inside the profiler's range (an NVTX "
                         "range a kernel: tools/device-run.sh's ncu step)")
    ap.add_argument("--offset", type=int, default=0,
                    help="also time every kernel with x and y starting this many elements past a 512-byte boundary")
    a = ap.parse_args()
    if a.offset < 0 or a.offset % 8:
        ap.error("--offset takes a multiple of 8 elements (the kernels need 16-byte aligned tensors)")

    import torch

    from range_check import TIME_ELEMS, VERIFY_ELEMS, Gpu, Range, label
    from runner.build.builder import Builder
    from runner.spec.spec import load_spec

    r = Range(a.op, ROOT / f"pipelines/{a.op}-range-h200.yaml")
    pfs = {int(p) for p in (a.pf or ("3,4" if a.op == "softmax" else "1,2,3,4")).split(",")}
    rs = None  # PF 3 with slots of --slot bytes: the range spec with its SLOT derive changed
    if a.slot and a.op == "softmax":
        text = (ROOT / "pipelines/softmax-range-h200.yaml").read_text()
        old = re.search(r'SLOT: "(\d+)"', text)
        if not old:
            raise SystemExit("the range spec has no SLOT derive any more: update this probe")
        tmp = ROOT / "pipelines/.fixed-n-probe-slot.yaml"
        tmp.write_text(text.replace(old.group(0), f'SLOT: "{a.slot}"'))
        try:
            rs = Range(a.op, tmp)
        finally:
            tmp.unlink()

    class Flagship:
        spec = load_spec(ROOT / f"pipelines/{a.op}-h200.yaml")
        sym = "N"
        shape = staticmethod(lambda n, m: {"M": m, "N": n})

    fr = Flagship()
    b, fb = Builder(r.spec), Builder(fr.spec)
    g, fg = (None, None) if a.compile_only else (Gpu(r), Gpu(fr))
    bs = Builder(rs.spec) if rs else None
    failures = 0
    for n in [int(x) for x in a.sizes.split(",") if x]:
        m = a.rows or max(1, TIME_ELEMS // n)
        shape = {"M": m, "N": n}
        # (kind, label, builder, gpu, cfg, source)
        cands = []
        for c in r.configs:
            if c["PF"] in pfs and r.serves(c, n):
                src = b.render_all(c, shapes=[shape])[0]
                cands.append((f"PF {c['PF']}", label(c), b, g, c, src))
                cands.append((f"PF {c['PF']} N fixed", label(c), b, g, c, fix_n(src, n)))
        if rs:
            for c in rs.configs:
                if c["PF"] == 3 and rs.serves(c, n):
                    src = bs.render_all(c, shapes=[shape])[0]
                    cands.append((f"PF 3 SLOT {a.slot}", label(c), bs, g, c, src))
                    cands.append((f"PF 3 SLOT {a.slot} N fixed", label(c), bs, g, c, fix_n(src, n)))
        for which in [w for w in a.patch.split(",") if w]:  # PF 3 with part of N's cut a constant
            for rr, bb, tag in ((r, b, ""), (rs, bs, f" SLOT {a.slot}")):
                for c in (rr.configs if rr else []):
                    if c["PF"] == 3 and rr.serves(c, n):
                        src = patched(bb.render_all(c, shapes=[shape])[0], n, c, which)
                        if src:
                            cands.append((f"PF 3{tag} +{which}", label(c), bb, g, c, src))
        for which in [w for w in a.ablate.split(",") if w]:  # PF 3 with part of the chain out
            for c in r.configs:
                if (c["PF"] == 3 and not c.get("LAG") and not c.get("ALIGN") and c["STORE"] != "bulk"
                        and not ((c.get("EXPOLY") or c.get("FUSE")) and "noexp" in which.split("/"))
                        and r.serves(c, n)):  # (EXPOLY, FUSE: noexp would leave their exponentials)
                    src = ablated(b.render_all(c, shapes=[shape])[0], a.op, which)
                    if src:
                        cands.append((f"PF 3 -{which} (not verified)", label(c), b, g, c, src))
        for c in flagship_configs(a.op):
            src = fb.render_all(c, shapes=[shape])[0]
            kind = {"tma": "flagship tma", "ring": "flagship ring", "f32": "flagship register hold"}.get(
                c["HOLD"], "flagship streaming")
            cands.append((kind, flabel(c), fb, fg, c, src))
        built = {}
        for bb in (x for x in (b, fb, bs) if x):  # each spec's own compile options
            srcs = list(dict.fromkeys(s for _k, _l, b2, _g, _c, s in cands if b2 is bb))
            built.update(zip(srcs, bb._compile_all(srcs)))
        print(f"\nN={n} (M={m}): {len(cands)} kernels, {len(built)} distinct sources", flush=True)
        ok = []
        for kind, lab, bb, gg, c, src in cands:
            res = built[src]
            spills = res.ok and (res.resources.get("spill_stores") or res.resources.get("spill_loads"))
            if not res.ok or spills:
                print(f"  skipped {kind} {lab}: {res.status if not res.ok else 'spills'}", flush=True)
                continue
            # a new kernel: verified at its own N first (an ablation never: it is wrong by construction)
            if ("fixed" in kind or "+" in kind) and "not verified" not in kind and not a.compile_only:
                vm = max(1, min(37, VERIFY_ELEMS // n))
                why = gg.verify(bb, c, res.artifact, {"M": vm, "N": n}, seed=77, round_=1)
                if why:
                    failures += 1
                    print(f"  FAIL {kind} {lab}: {why}", flush=True)
                    continue
            ok.append((kind, lab, bb, gg, c, res.artifact))
        if a.compile_only:
            print(f"  {len(ok)} compiled without spills", flush=True)
            continue
        src_t = torch.randn(m * n, device="cuda", dtype=torch.bfloat16)
        offs = [0, a.offset] if a.offset else [0]
        # (kind, label, builder, gpu, cfg, artifact, offset): the moved kernels as kinds of their own
        runs = [(*k, 0) for k in ok] + [(f"{k[0]} @+{a.offset}", *k[1:], a.offset) for k in ok if a.offset]
        times: list[list[float]] = [[] for _ in runs]
        copies: dict[int, list[float]] = {off: [] for off in offs}
        pairs = {off: moved_pair(src_t, off) for off in offs}
        for _ in range(3):  # interleaved rounds: every kernel and the copy once a round
            for off in offs:
                sv, dv = pairs[off]
                copies[off].append(g.time(lambda: dv.copy_(sv)))
            for i, (_kind, _lab, bb, gg, c, art, off) in enumerate(runs):
                times[i].append(gg.timed(bb, c, art, n, m=m)[0] if off == 0 else
                                timed_moved(gg, bb, c, art, n, m, off))
        copy = sorted(copies[0])[1]
        nbytes = 4 * m * n
        print(f"  copy {copy * 1e6:.1f} us ({nbytes / copy / 1e12:.2f} TB/s)", flush=True)
        if a.offset:
            cm = sorted(copies[a.offset])[1]
            print(f"  copy @+{a.offset} {cm * 1e6:.1f} us ({nbytes / cm / 1e12:.2f} TB/s)", flush=True)
        for kind in dict.fromkeys(k for k, *_ in runs):
            rows = sorted((sorted(times[i])[1], lab) for i, (k, lab, *_r) in enumerate(runs) if k == kind)
            print(f"  {kind}: {len(rows)} kernels", flush=True)
            for t, lab in rows[:a.top]:
                print(f"    {t * 1e6:8.1f} us  {nbytes / t / 1e12:5.2f} TB/s  {copy / t:4.2f} of copy  {lab}", flush=True)
        words = [w for w in a.ncu.split("/") if w]
        if words:  # one launch of each chosen kernel inside the profiler's range, its NVTX range named
            calls = []  # (name, call), each made and launched once before the profiler's range
            for kind, lab, bb, gg, c, art, off in runs:
                if off == 0 and all(w in f"{kind} {lab}" for w in words):
                    shape, inputs, outs = gg.timing_inputs(n, m)
                    geo = bb.geometry(c, [shape])[0]
                    fn = gg.rt.load(art, gg.r.spec.kernel.entry, gg.kinds)
                    call = gg.rt.prepare(fn, gg.values(shape, inputs, outs, gg.workspace(geo)), geo, mode="direct")
                    call()
                    calls.append((f"N={n} {kind} {lab}", call))
            print(f"  ncu: {len(calls)} kernels, one launch each in the profiler's range", flush=True)
            from ncu_range import profiled

            profiled(calls)
    print(f"\n{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
