"""The compile-only check of a spec's whole space, shared by tools/range_check.py and
tools/attn_check.py (no GPU): pipe's own Builder renders, checks and compiles."""

from __future__ import annotations


def compile_space(sp, configs: list[dict], shapes: list[dict], geo_shape: dict, fail, label):
    """Every configuration rendered at two `shapes` (one source for both: the sizes reach the
    kernel at run time), no Jinja left, the forbidden-source rules; NVRTC once for each
    distinct source; then no spills, within the launch limits at `geo_shape` (the runner's
    prune) and no calls to external functions. `fail(msg)` is told each failure, `label(cfg)`
    names a configuration. Returns (the Builder, [(cfg, compiled) for each distinct source
    that compiled, cfg the first configuration that rendered it], {source: its configurations}
    in order: nvcc_all's argument)."""
    from runner.build.builder import Builder

    b = Builder(sp)
    sources, owners = [], {}
    for cfg in configs:
        try:
            s1, s2 = b.render_all(cfg, shapes=shapes)
        except Exception as e:  # noqa: BLE001
            fail(f"{label(cfg)}: render: {e}")
            continue
        if s1 != s2:
            fail(f"{label(cfg)}: the source depends on the shape")
        if "{{" in s1 or "{%" in s1:
            fail(f"{label(cfg)}: Jinja left in the source")
        v = b.source_rules(s1)
        if v:
            fail(f"{label(cfg)}: forbidden: {v}")
        owners.setdefault(s1, []).append(cfg)
        if len(owners[s1]) == 1:
            sources.append(s1)
    out = []
    for src, c in zip(sources, b._compile_all(sources)):
        cfg = owners[src][0]
        if not c.ok:
            fail(f"{label(cfg)}: {c.status}: {c.reason}")
            continue
        res = c.resources
        if res.get("spill_stores") or res.get("spill_loads") or res.get("stack_bytes"):
            fail(f"{label(cfg)}: spills ({res})")
        geo = b.geometry(cfg, [geo_shape])[0]  # threads, cluster, shared memory
        why = b.backend.prune(res, geo, sp.hw, False)  # the launch limits (spills are reported above)
        if why:
            fail(f"{label(cfg)}: pruned: {why}")
        ext = set((c.ptx or {}).get("extern", {})) - {"__assertfail", "vprintf"}
        if ext:
            fail(f"{label(cfg)}: calls external functions {sorted(ext)}")
        out.append((cfg, c))
    return b, out, owners


def _nvcc_one(args: tuple[str, str]) -> tuple[int, str]:
    import hashlib
    import subprocess
    from pathlib import Path

    src, tmpdir = args
    cu = Path(tmpdir) / f"{hashlib.sha256(src.encode()).hexdigest()[:16]}.cu"
    cu.write_text(src)
    p = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", "-cubin", "-Xptxas", "-v",
                        "-o", str(cu.with_suffix(".cubin")), str(cu)], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def nvcc_all(owners: dict, fail, label) -> None:
    """Every distinct source (`owners`: source -> its configurations, in order) compiled with
    the local nvcc for sm_90a as well, in a pool of processes: no failure and no spills."""
    import os
    import re
    import tempfile
    import time
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.time()
    sources = list(owners)
    tmpdir = tempfile.mkdtemp(prefix="space_nvcc_")
    with ProcessPoolExecutor(max_workers=max(1, os.cpu_count() or 2)) as pool:
        out = list(pool.map(_nvcc_one, [(s, tmpdir) for s in sources]))
    regs = []
    for src, (rc, log) in zip(sources, out):
        who = label(owners[src][0])
        if rc:
            fail(f"{who}: nvcc -arch=sm_90a failed: {log.strip().splitlines()[-1] if log.strip() else rc}")
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
        if m and any(int(x) for x in m.groups()):
            fail(f"{who}: nvcc sm_90a spills: {m.group(0)}")
        m = re.search(r"Used (\d+) registers", log)
        if m:
            regs.append(int(m.group(1)))
    print(f"  {len(sources)} sources compiled with nvcc -arch=sm_90a in {time.time() - t0:.0f} s; "
          f"registers {min(regs, default=0)} .. {max(regs, default=0)}")


def entry_params(spec, src: str) -> list[int]:
    """The byte sizes of the entry's parameters, from the PTX NVRTC makes of `src` with the
    spec's options (no GPU): what a probe checks its packed arguments against."""
    import re

    from cuda.core import Program

    from runner.build.backends import cuda

    prog = Program(src, "c++", cuda._options(spec.kernel.options, spec.hw.arch or "sm_90", "probe.cu"))
    prog.compile("cubin")
    ptx = cuda._ptx_text(prog)
    m = re.search(r"\.entry\s+" + re.escape(spec.kernel.entry) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise RuntimeError(f"no entry {spec.kernel.entry} in the PTX")
    out = []
    for decl in m.group(1).split(","):
        arr = re.search(r"\.b8\s+\S+?\[(\d+)\]", decl)  # a struct by value: `.align 64 .b8 name[128]`
        bits = re.search(r"\.param\s+\.[usbf](\d+)\s", decl)
        out.append(int(arr.group(1)) if arr else int(bits.group(1)) // 8 if bits else 0)
    return out


def sample_configs(spec, only: list[str], all_: bool, sample: int, favour=None) -> list[dict]:
    """A probe's configurations: every one of the space (`all_`), or the start, those `favour`
    picks, and a seeded sample up to `sample`; `only` ("NAME=V1,V2") filters any of them."""
    import random

    cfgs = [dict(c) for c in spec.space]
    for o in only:
        k, vs = o.split("=")
        cfgs = [c for c in cfgs if str(c[k]) in vs.split(",")]
    if all_:
        return cfgs
    rng = random.Random(0)
    start = dict(spec.start)
    first = ([start] if start in cfgs else []) + [c for c in cfgs if favour and favour(c) and c != start]
    rest = [c for c in cfgs if c not in first]
    return first + rng.sample(rest, max(0, min(sample - len(first), len(rest))))


def median_time(rt, call, reps: int) -> float:
    """The median of `reps` calls by the runner's own timer (the L2 flushed, then its device
    spin ahead of the start event), after one untimed call."""
    import torch

    call()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        rt.flush()
        ts.append(rt.timer(call, torch.cuda.synchronize))
    ts.sort()
    return ts[len(ts) // 2]

