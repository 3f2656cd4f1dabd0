"""Correctness and speed of the run-time row-length templates (issue 20) on one GPU, or their
render and compile checks on a machine without one.

    python tools/range_check.py                  # the H200: verify and time a sample of each space
    python tools/range_check.py --compile-only   # no GPU: every configuration rendered and compiled
    python tools/range_check.py --compile-only --nvcc   # ... with the local nvcc for sm_90a as well

For each range spec (pipelines/*-range-h200.yaml) it reads the space, the derived values,
the domain and `kernel.serves` (from the spec when pipe's loader knows them, else from the
YAML: a copy without the range keys is loaded for the rest). Everything else is pipe's own:
the Builder renders, checks the forbidden actions and compiles (NVRTC, in its pool of
processes), the CUDA Runtime loads the cubins and launches through cuda.core, the judge's
inputs, float64 reference, guard-banded outputs and error budget check the results.

Compile-only (no GPU): the range symbol and M never reach the template (the template reads
neither, nor a derived value that depends on them, and two shapes render the same source);
every N of the domain is served by some configuration (checked on a dense sample: the edges,
around every power of two and three times one, and random points); every configuration
renders, passes the source rules and compiles with no spills, and a persistent grid's MINB
blocks fit an SM's shared memory and registers. Prints the bucket table. With --only the
coverage of the domain is a note, not a failure (a part of the space need not cover it).

On the GPU: a sample of each space, three configurations of every bucket and path (CAP; the
register hold, PF = 0 or 1, apart from the rings, PF = 2 and 3; the first and last geometry and one
at random, no spills with that machine's NVRTC), is verified at the bucket's edges, powers of
two, odd sizes and primes, for M in {1, 3, 37, 4096} (M capped so that M * N <= 2^25), each launch with the next input distribution of the spec and its output
in the middle of a guard band; then each sampled configuration is timed at M * N = 2^27 (the
median of 20 calls, L2 flushed before each, CUDA events) at its bucket's largest power of two
and an odd size, beside torch eager. Both cross-entropy templates are also run once, each in
a child process, with a target out of range: the launch must fail with a device-side assert.
One line per failure; exit status 1 on any.
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

SPECS = {"softmax": "pipelines/softmax-range-h200.yaml",
         "rmsnorm": "pipelines/rmsnorm-range-h200.yaml",
         "cross-entropy": "pipelines/cross-entropy-range-h200.yaml"}
RANGE_KEYS = (("op", "domain"), ("op", "grid"), ("kernel", "serves"))
VERIFY_ELEMS = 1 << 25  # M * N at most, for the float64 reference
TIME_ELEMS = 1 << 27    # M * N of a timed shape (256 MiB of bf16)

FAILURES: list[str] = []
PERSISTENT = (1, 2, 3)  # the PF values whose grid is persistent: rows strided over gridDim


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print(f"FAIL {msg}", flush=True)


# ----------------------------------------------------------------------------- the spec


class Range:
    """A range spec: pipe's Spec (loaded without the range keys where the loader does not
    know them yet), its domain, serves expression and range symbol."""

    def __init__(self, name: str, path: Path):
        import yaml

        from runner.core.expr import compile_expr
        from runner.core.errors import SpecError
        from runner.spec.spec import load_spec

        self.name = name
        self.raw = yaml.safe_load(path.read_text())
        try:
            self.spec = load_spec(path)
        except SpecError:  # a loader that does not know domain, grid and serves yet
            stripped = copy.deepcopy(self.raw)
            for a, b in RANGE_KEYS:
                stripped[a].pop(b, None)
            from runner.core import userpath

            found, _ = userpath.find_template(stripped["kernel"]["template"], path.resolve().parent)
            stripped["kernel"]["template"] = str(found or stripped["kernel"]["template"])
            tmp = Path(tempfile.mkdtemp(prefix="range_check_")) / path.name
            tmp.write_text(yaml.safe_dump(stripped, sort_keys=False))
            self.spec = load_spec(tmp)
        self.domain = self.raw["op"]["domain"]
        self.sym = next(s for s, d in self.domain.items() if "max" in d)  # N or V
        self.lo, self.hi = int(self.domain[self.sym]["min"]), int(self.domain[self.sym]["max"])
        ks = getattr(self.spec.kernel, "serves", None)
        self.serves_expr = ks if callable(ks) else compile_expr(self.raw["kernel"]["serves"])
        self.configs = list(self.spec.space)
        self.restricted = False  # set by --only: coverage of the domain is not asked of a part
        self._derived: dict = {}

    def env(self, cfg: dict, shape: dict) -> dict:
        env = {**shape, **cfg}
        env.update(self.spec.kernel.derived(env))
        return env

    def serves(self, cfg: dict, n: int, m: int = 4096) -> bool:
        """At many rows by default (the bucket; a spec may admit more sizes for few rows)."""
        return bool(self.serves_expr(self.env(cfg, {"M": m, self.sym: n})))

    def cap(self, cfg: dict) -> int:
        """The bucket's key: the derived CAP (the same for every shape)."""
        return int(self.env(cfg, {"M": 1, self.sym: self.lo})["CAP"])

    def shape(self, n: int, m: int) -> dict:
        return {"M": m, self.sym: n}


def label(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def primes_near(n: int, k: int = 1) -> list[int]:
    out, x = [], n
    while len(out) < k and x > 2:
        if all(x % d for d in range(2, int(math.isqrt(x)) + 1)):
            out.append(x)
        x -= 1
    return out


def coverage_points(lo: int, hi: int, rng: random.Random) -> list[int]:
    pts = set(range(lo, min(hi, lo + 2048) + 1)) | set(range(max(lo, hi - 2048), hi + 1))
    for k in range(0, 20):
        for base in (1 << k, 3 << k, 5 << k):
            for d in range(-24, 25):
                if lo <= base + d <= hi:
                    pts.add(base + d)
    pts |= {rng.randint(lo, hi) for _ in range(20000)}
    return sorted(pts)


# ----------------------------------------------------------------------------- compile-only


def check_static(r: Range, nvcc: bool) -> None:
    from runner.build import render
    from space_check import compile_space, nvcc_all

    sp = r.spec
    k = sp.kernel
    symbols = set(sp.op.symbols)
    used = render.template_variables(k.template)
    read = used & symbols
    if read:
        fail(f"{r.name}: the template reads the shape symbols {sorted(read)}")
    derive = dict(k.derive)
    deps: dict[str, set] = {}
    for name, e in k.derive:  # the shape symbols each derived value depends on, through earlier ones
        deps[name] = set(e.names) & symbols
        for n2 in e.names:
            deps[name] |= deps.get(n2, set())
    for name in sorted(used & set(derive)):
        if deps[name]:
            fail(f"{r.name}: the template reads derived value {name}, which depends on {sorted(deps[name])}")

    # coverage of the domain and the bucket table
    rng = random.Random(0)
    pts = coverage_points(r.lo, r.hi, rng)
    by_cap: dict[int, list[dict]] = {}
    for cfg in r.configs:
        by_cap.setdefault(r.cap(cfg), []).append(cfg)
    reps = {cap: cfgs[0] for cap, cfgs in by_cap.items()}  # serves depends on the bucket alone here
    for cap, cfgs in by_cap.items():
        for cfg in cfgs[1:3]:
            for n in (r.lo, cap // 4 + 1, cap - 9, cap, r.hi):
                if r.serves(cfg, n) != r.serves(reps[cap], n):
                    fail(f"{r.name}: configurations of CAP {cap} serve N={n} differently")
    served_by: dict[int, list[int]] = {cap: [] for cap in reps}
    missing = []
    for n in pts:
        hit = False
        for cap, cfg in reps.items():
            if r.serves(cfg, n):
                served_by[cap].append(n)
                hit = True
        if not hit:
            missing.append(n)
    if missing:
        msg = (f"{r.name}: {len(missing)} of {len(pts)} sampled {r.sym} served by no configuration: "
               f"{missing[:12]}{' ...' if len(missing) > 12 else ''}")
        if r.restricted:  # --only: a part of the space need not cover the domain
            print(f"note {msg} (the space is restricted by --only)")
        else:
            fail(msg)
    print(f"\n{r.name}: {len(r.configs)} configurations, {len(by_cap)} buckets "
          f"({r.sym} in [{r.lo}, {r.hi}]; {len(pts)} sampled sizes, {len(missing)} unserved)")
    print(f"  {'CAP':>8} {'configs':>7}  {r.sym} served (sampled)")
    for cap in sorted(by_cap):
        s = served_by[cap]
        print(f"  {cap:>8} {len(by_cap[cap]):>7}  " + (f"{min(s)} .. {max(s)}" if s else "none in the domain"))
        if not s:
            fail(f"{r.name}: bucket CAP {cap} serves no sampled size of the domain")

    # render every configuration (two shapes: the same source), the source rules, NVRTC
    t0 = time.time()
    b, compiled, owners = compile_space(sp, r.configs, [r.shape(r.lo, 1), r.shape(r.hi - 1, 4099)],
                                        r.shape(r.lo, 37), fail, lambda cfg: f"{r.name}: {label(cfg)}")
    check_resident(r, b, compiled)
    regs = [c.resources.get("registers", 0) for _, c in compiled]
    print(f"  {len(owners)} distinct sources compiled with NVRTC ({b.backend.toolchain()}, {sp.hw.arch}) in "
          f"{time.time() - t0:.0f} s; registers {min(regs, default=0)} .. {max(regs, default=0)}")
    if nvcc:
        nvcc_all(owners, fail, lambda cfg: f"{r.name}: {label(cfg)}")


def check_resident(r: Range, b, compiled: list) -> None:
    """A persistent grid (PF > 0) launches as many blocks as MINB an SM: those blocks' shared
    memory (dynamic, static, and the 1 KiB the SM reserves a block) must fit the SM's, and their
    registers its register file, or the grid runs in waves and the ring's depth is not what the
    spec assumed. PF = 3 also needs whole warps and its producer warp in the block (INLINE: none)."""
    hw = r.spec.hw
    sm_smem = hw.get("shared_mem_per_sm_bytes", 233472)
    sm_regs = hw.get("registers_per_sm", 65536)
    for cfg, c in compiled:
        if not cfg.get("PF"):
            continue
        env = r.env(cfg, {"M": 1 << 20, r.sym: r.lo})
        minb = int(env["MINB"])
        geo = b.geometry(cfg, [r.shape(r.lo, 1 << 20)])[0]
        threads = math.prod(geo.get("block") or [1])
        smem = geo.get("shared_mem", 0) + c.resources.get("static_smem", 0) + 1024
        regs = c.resources.get("registers", 0)
        per_block_regs = -(-(regs * 32) // 256) * 256 * -(-threads // 32)
        if minb * smem > sm_smem:
            fail(f"{r.name}: {label(cfg)}: {minb} blocks of {smem} bytes of shared memory exceed the SM's {sm_smem}")
        if minb * per_block_regs > sm_regs:
            fail(f"{r.name}: {label(cfg)}: {minb} blocks of {threads} threads at {regs} registers exceed the SM's {sm_regs}")
        if cfg.get("PF") == 3 and threads != cfg["TPR"] + (0 if cfg.get("INLINE") else 32):
            fail(f"{r.name}: {label(cfg)}: a block of {threads} threads, not TPR + the producer warp "
                 "(INLINE: TPR alone)")


# ----------------------------------------------------------------------------- on the GPU


def path_of(cfg: dict) -> str:
    """The kernel path a configuration takes: "ring" (PF = 2: the rows streamed through a ring
    of shared-memory slots), "bulk" (PF = 3: a ring of slots filled by the bulk-copy engine
    from a producer warp) or "hold" (the row in registers, PF = 0 or 1). Sampled apart, so
    that each path of a bucket gets its own configurations."""
    return {2: "ring", 3: "bulk"}.get(cfg.get("PF"), "hold")


def sample_configs(r: Range, per_bucket: int, rng: random.Random) -> list[dict]:
    by_cap: dict[tuple, list[dict]] = {}
    for cfg in r.configs:
        by_cap.setdefault((r.cap(cfg), path_of(cfg)), []).append(cfg)
    out = []
    for key in sorted(by_cap):
        cap, cfgs = key[0], by_cap[key]
        if not any(r.serves(cfgs[0], n) for n in (max(r.lo, cap // 4 + 1), min(r.hi, cap), r.lo, r.hi)):
            continue
        # spread over the geometries (the hints ride along at random)
        geos: dict[tuple, list[dict]] = {}
        for cfg in cfgs:
            geos.setdefault(tuple(v for k, v in cfg.items() if k not in ("LOAD", "STORE")), []).append(cfg)
        keys = sorted(geos)
        rest = keys[1:-1]
        rng.shuffle(rest)
        for key in list(dict.fromkeys([keys[0], keys[-1]] + rest))[:max(per_bucket, 1)]:
            out.append(rng.choice(geos[key]))
    return out


def test_sizes(r: Range, cfg: dict, rng: random.Random, many: int) -> list[int]:
    """Sizes the configuration serves: its bucket's edges, powers of two, odd sizes, primes; and,
    for a configuration that no bucket caps (PF = 4 serves every row from 16384 up), the same
    kinds of size across the whole domain, each kept only where `serves` holds."""
    cap = r.cap(cfg)
    lo, hi = max(r.lo, cap // 4 + 1), min(r.hi, cap)
    cand = {lo, lo + 1, hi, hi - 1, hi - 7, hi - 8, hi - 9, hi - 15}
    cand |= {1 << k for k in range(0, 20) if lo <= 1 << k <= hi}
    cand |= set(primes_near(hi, 2)) | set(primes_near((lo + hi) // 2, 1)) | set(primes_near(lo + 64, 1))
    cand |= {rng.randint(lo, hi) | 1 for _ in range(3)} | {(rng.randint(lo, hi) & ~3) | 2 for _ in range(2)}
    if r.serves(cfg, min(r.hi, 2 * cap)) and r.lo <= 2 * cap:  # no bucket caps it
        k0, k1 = r.lo.bit_length(), r.hi.bit_length()
        cand |= {n for k in range(k0, k1) for n in ((1 << k) - 1, 1 << k, (1 << k) + 1, 3 << (k - 1))}
        cand |= {r.hi, r.hi - 1} | set(primes_near(r.hi, 2))
        cand |= {rng.randint(r.lo, r.hi) | 1 for _ in range(3)} | {(rng.randint(r.lo, r.hi) & ~3) | 2 for _ in range(2)}
    ok = sorted(n for n in cand if r.lo <= n <= r.hi and r.serves(cfg, n))
    if len(ok) > many:
        keep = {ok[-1]} if many < 2 else {ok[0], ok[-1]} | set(rng.sample(ok[1:-1], many - 2))
        ok = sorted(keep)
    return ok


class Gpu:
    def __init__(self, r: Range):
        import torch

        from runner.build.backends import cuda
        from runner.core.userpath import load_callable

        self.torch = torch
        self.r = r
        self.op = r.spec.op
        if r.spec.kernel.tensor_maps:  # the judge's worker builds them; this tool passes pointers only
            raise SystemExit(f"{r.spec.name}: kernel.tensor_maps is not supported by this tool; use pipe eval")
        self.rt = cuda.Runtime(r.spec.hw, r.spec.runtime)
        self.reference = load_callable(self.op.reference, r.spec.home)
        self.scalars = {s.name: s.value for s in self.op.scalars}
        # kernel.scratch: allocated zero for each call as the judge does (judge/verify.scratch),
        # and after a verified call checked zero again within intact guards
        names = {t.name for t in (*self.op.inputs, *self.op.outputs, *r.spec.kernel.scratch)}
        types = {s.name: s.type for s in self.op.scalars}
        self.kinds = [("ptr" if a in names else types.get(a, self.rt.symbol_type)) for a in r.spec.kernel.args]

    def workspace(self, geo: dict) -> list:
        """The configuration's scratch buffers on one shape, zeroed inside guard bands."""
        from runner.judge.inputs import TORCH_DTYPES
        from runner.judge.verify import scratch

        shapes = geo.get("scratch") or {}
        return [scratch(sc.name, tuple(shapes[sc.name]), TORCH_DTYPES[sc.dtype], "cuda")
                for sc in self.r.spec.kernel.scratch]

    def values(self, shape: dict, inputs: dict, outs: list, ws: list = ()) -> list:
        tensors = {**{k: v.data_ptr() for k, v in inputs.items()},
                   **{t.name: o.data_ptr() for t, o in zip(self.op.outputs, outs)},
                   **{w.name: w.ptr for w in ws}}
        return [tensors[a] if a in tensors else self.scalars[a] if a in self.scalars else shape[a]
                for a in self.r.spec.kernel.args]

    def verify(self, b, cfg: dict, art: str, shape: dict, seed: int, round_: int, grid_cap: int = 0) -> str | None:
        """Why one launch's output (or scratch) is wrong, or None. grid_cap > 0: a persistent
        grid (PERSISTENT) cut to that many blocks (a whole number of clusters), as when other
        work holds most of the SMs: the rows (or pieces) then fall to fewer blocks, more each."""
        from runner.judge.inputs import TORCH_DTYPES, make_inputs, shape_of
        from runner.judge.verify import Budget, compare, poisoned, reference_dtype

        torch = self.torch
        inputs = make_inputs(self.op, shape, seed, round_, "cuda")
        env = self.op.shape_env(shape)
        outs = [poisoned(shape_of(t, env), TORCH_DTYPES[t.dtype], "cuda") for t in self.op.outputs]
        geo = b.geometry(cfg, [shape])[0]
        if grid_cap and cfg.get("PF") in PERSISTENT:
            cl = cfg.get("CL", 1)
            geo = {**geo, "grid": [min(geo["grid"][0], max(cl, grid_cap - grid_cap % cl)), *geo["grid"][1:]]}
        ws = self.workspace(geo)
        fn = self.rt.load(art, self.r.spec.kernel.entry, self.kinds)
        call = self.rt.prepare(fn, self.values(shape, inputs, [o.view for o in outs], ws), geo, mode="direct")
        for _ in range(2):  # twice: the second call finds the scratch as the first left it
            call()
            torch.cuda.synchronize()
            for w in ws:
                if w.problem():
                    return w.problem()
        private = {k: (v.to(torch.float64) if v.dtype.is_floating_point else v) for k, v in inputs.items()}
        ref = self.reference(**private, **self.scalars)
        refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        for t, o, rr in zip(self.op.outputs, outs, refs):
            dt = TORCH_DTYPES[t.dtype]
            rr = rr.to(reference_dtype(dt)) if rr.is_floating_point() else rr
            if not o.guards_intact():
                return f"output '{t.name}': wrote outside its bounds"
            ok, why, _ = compare(o.view, rr, self.op.atol, self.op.rtol,
                                 Budget(rr, self.op.atol, self.op.rtol, dt, self.op.ulps, self.op.floor))
            if not ok:
                dist = self.op.inputs[0].dists[round_ % len(self.op.inputs[0].dists)]
                return f"output '{t.name}' (input dist {dist}): {why}"
        return None

    def time(self, call, reps: int = 20) -> float:
        torch = self.torch
        ts = []
        call()
        torch.cuda.synchronize()
        for _ in range(reps):
            self.rt.flush()
            torch.cuda._sleep(100_000)  # ~50 us of GPU work queued ahead: the host's launch stays out of the events
            a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            e.record()
            e.synchronize()
            ts.append(a.elapsed_time(e) / 1e3)
        return sorted(ts)[len(ts) // 2]

    def timing_inputs(self, n: int, m: int | None = None) -> tuple[dict, dict, list]:
        """(shape, inputs, outputs) at M * N = 2^27 (or M = m), made once a size."""
        from runner.judge.inputs import TORCH_DTYPES, make_inputs, shape_of

        m = m or max(1, TIME_ELEMS // n)
        if getattr(self, "_tin", (None,))[0] != (n, m):
            self._tin = None  # the last size's tensors go first
            shape = self.r.shape(n, m)
            env = self.op.shape_env(shape)
            outs = [self.torch.empty(shape_of(t, env), dtype=TORCH_DTYPES[t.dtype], device="cuda")
                    for t in self.op.outputs]
            self._tin = ((n, m), shape, make_inputs(self.op, shape, 1, 0, "cuda", timed=True), outs)  # timed values
        return self._tin[1:]

    def timed(self, b, cfg: dict, art: str, n: int, m: int | None = None) -> tuple[float, float]:
        """(seconds, TB/s) at M * N = 2^27 (or M = m)."""
        shape, inputs, outs = self.timing_inputs(n, m)
        t = self.timed_on(b, cfg, art, shape, inputs, outs)
        return t, self.op.bytes(self.op.shape_env(shape)) / t / 1e12

    def timed_on(self, b, cfg: dict, art: str, shape: dict, inputs: dict, outs: list) -> float:
        """Seconds of one configuration at `shape` on the given tensors."""
        fn = self.rt.load(art, self.r.spec.kernel.entry, self.kinds)
        geo = b.geometry(cfg, [shape])[0]
        ws = self.workspace(geo)
        call = self.rt.prepare(fn, self.values(shape, inputs, outs, ws), geo, mode="direct")
        t = self.time(call)
        for w in ws:
            if w.problem():
                fail(f"{self.r.name}: {label(cfg)}: after timing at {shape}: {w.problem()}")
        return t

    def eager(self, n: int, m: int | None = None) -> float:
        shape, inputs, _ = self.timing_inputs(n, m)
        t = self.time(lambda: self.reference(**inputs, **self.scalars))
        return self.op.bytes(self.op.shape_env(shape)) / t / 1e12


def check_gpu(r: Range, per_bucket: int, many: int, ms: list[int], timing: bool, every: bool = False,
              sweep: list[int] | None = None, top: int = 5, rows: int | None = None, grid_cap: int = 0) -> None:
    from runner.build.builder import Builder

    rng = random.Random(20)
    b = Builder(r.spec)
    cfgs = list(r.configs) if every else sample_configs(r, per_bucket, rng)
    t0 = time.time()
    srcs = [b.render_all(c, shapes=[r.shape(r.lo, 1)])[0] for c in cfgs]
    comp = b._compile_all(list(dict.fromkeys(srcs)))
    by_src = dict(zip(dict.fromkeys(srcs), comp))
    keep = []
    for cfg, src in zip(cfgs, srcs):
        c = by_src[src]
        res = c.resources if c.ok else {}
        if not c.ok:
            fail(f"{r.name}: {label(cfg)}: {c.status}: {c.reason}")
        elif res.get("spill_stores") or res.get("spill_loads"):  # the runner prunes these (forbidden: spills)
            fail(f"{r.name}: {label(cfg)}: spills with this machine's NVRTC ({b.backend.toolchain()}): {res}")
        else:
            keep.append((cfg, c.artifact))
    cfgs, arts = [k[0] for k in keep], [k[1] for k in keep]
    print(f"\n{r.name}: {len(cfgs)} sampled configurations of {len(r.configs)}, compiled in {time.time() - t0:.0f} s",
          flush=True)
    g = Gpu(r)
    checked = 0
    round_ = 0
    for cfg, art in zip(cfgs, arts):
        cap = r.cap(cfg)
        for n in test_sizes(r, cfg, rng, many):
            for m in ms:
                m = m if m * n <= VERIFY_ELEMS else max(1, min(m, VERIFY_ELEMS // n))
                shape = r.shape(n, m)
                try:
                    why = g.verify(b, cfg, art, shape, seed=1000 + round_, round_=round_)
                    if not why and grid_cap and cfg.get("PF") in PERSISTENT:
                        why = g.verify(b, cfg, art, shape, seed=1000 + round_, round_=round_, grid_cap=grid_cap)
                        why = why and f"grid cut to {grid_cap} blocks: {why}"
                except Exception as e:  # noqa: BLE001 - a launch that failed (a trap) spoils the context
                    fail(f"{r.name}: CAP {cap} {label(cfg)} at {shape}: launch failed: {type(e).__name__}: {e}")
                    raise SystemExit(1)
                round_ += 1
                checked += 1
                if why:
                    fail(f"{r.name}: CAP {cap} {label(cfg)} at M={shape['M']} {r.sym}={n}: {why}")
    print(f"  {checked} launches verified in {time.time() - t0:.0f} s", flush=True)
    if sweep:
        sweep_sizes(r, g, b, cfgs, arts, sweep, top, rows)
        return
    if not timing:
        return
    print(f"  {'CAP':>7} {'configuration':<46} {r.sym:>7} {'us':>8} {'TB/s':>6} {'eager':>6}")
    eager: dict[int, float] = {}
    for cfg, art in zip(cfgs, arts):
        cap = r.cap(cfg)
        lo, hi = max(r.lo, cap // 4 + 1), min(r.hi, cap)
        pts = [n for n in (1 << int(math.log2(hi)), ((lo + hi) // 2) | 1) if r.serves(cfg, n)]
        for n in dict.fromkeys(pts):
            if n not in eager:
                eager[n] = g.eager(n)
            t, tbs = g.timed(b, cfg, art, n)
            print(f"  {cap:>7} {label(cfg):<46} {n:>7} {t * 1e6:>8.1f} {tbs:>6.2f} {eager[n]:>6.2f}", flush=True)


def sweep_sizes(r: Range, g: "Gpu", b, cfgs: list[dict], arts: list[str], sizes: list[int],
                top: int = 5, rows: int | None = None) -> None:
    """Every checked configuration that serves a size, timed there: the best `top`, the count
    and torch eager. `rows`: M of the timed shape (default: M * N = 2^27)."""
    for n in sizes:
        if not r.lo <= n <= r.hi:
            continue
        found = []
        for cfg, art in zip(cfgs, arts):
            if r.serves(cfg, n):
                t, tbs = g.timed(b, cfg, art, n, m=rows)
                found.append((t, tbs, cfg))
        found.sort(key=lambda x: x[0])
        eager = g.eager(n, m=rows)
        m = g.timing_inputs(n, rows)[0]["M"]
        print(f"  {r.sym}={n} (M={m}): {len(found)} configurations; eager {eager:.2f} TB/s", flush=True)
        for t, tbs, cfg in found[:top]:
            print(f"    {t * 1e6:8.1f} us {tbs:5.2f} TB/s  CAP {r.cap(cfg):>6}  {label(cfg)}", flush=True)


# ----------------------------------------------------------------------------- the assert


PROBE = r"""
import sys
sys.path[:0] = [{root!r}, {root!r} + "/tools"]
from pathlib import Path

import torch
from range_check import Gpu, Range
from runner.build.builder import Builder
from runner.spec.spec import load_spec

if {which!r} == "flagship":
    class R:
        spec = load_spec(Path({root!r}) / "pipelines/cross-entropy-h200.yaml")
        sym = "V"
        shape = staticmethod(lambda n, m: {{"M": m, "V": n}})
    r, cfg = R(), dict(R.spec.start)
else:
    r = Range("cross-entropy", Path({root!r}) / "pipelines/cross-entropy-range-h200.yaml")
    cfg = next(c for c in r.configs if r.serves(c, 1000))
b = Builder(r.spec)
shape = r.shape(1000, 4)
arts, bad = b.compiled(b.render_all(cfg, shapes=[shape]))
g = Gpu(r)
x = torch.randn(4, 1000, device="cuda").bfloat16()
t = torch.tensor([1, 2, 1000, 3], device="cuda")  # row 2: out of range, and not ignore_index
loss = torch.empty(4, device="cuda")
fn = g.rt.load(arts[0], r.spec.kernel.entry, g.kinds)
vals = g.values(shape, {{"logits": x, "targets": t}}, [loss])
try:
    g.rt.prepare(fn, vals, b.geometry(cfg, [shape])[0], mode="direct")()
    torch.cuda.synchronize()
    print("NO-ASSERT", loss.tolist())
except Exception as e:
    print("ASSERTED", type(e).__name__, str(e).splitlines()[0])
"""


def check_assert() -> None:
    for which in ("flagship", "range"):
        code = PROBE.format(root=str(ROOT), which=which)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        if "ASSERTED" in p.stdout and "assert" in out.lower():
            print(f"cross-entropy ({which}): a target out of range fails a device-side assert: ok")
        else:
            tail = " | ".join(out.strip().splitlines()[-3:])
            fail(f"cross-entropy ({which}): a target out of range did not fail a device-side assert: {tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true", help="no GPU: render and compile every configuration")
    ap.add_argument("--nvcc", action="store_true", help="with --compile-only: also nvcc -arch=sm_90a")
    ap.add_argument("--ops", default=",".join(SPECS), help="comma-separated: " + ", ".join(SPECS))
    ap.add_argument("--only", action="append", default=[], metavar="NAME=V1,V2",
                    help="limit a parameter to some values (pipe's --only)")
    ap.add_argument("--per-bucket", type=int, default=3, help="configurations sampled per bucket (GPU)")
    ap.add_argument("--sizes", type=int, default=7, help="sizes verified per configuration (GPU)")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--all", action="store_true", help="verify every configuration, not a sample (GPU)")
    ap.add_argument("--sweep", default="", metavar="N1,N2,...",
                    help="time every verified configuration that serves each size, instead of the sample's timing")
    ap.add_argument("--top", type=int, default=5, help="with --sweep: configurations listed a size")
    ap.add_argument("--rows", type=int, default=0, help="with --sweep: M of the timed shape (default M * N = 2^27)")
    ap.add_argument("--no-assert", action="store_true", help="skip the out-of-range target probe")
    ap.add_argument("--grid-cap", type=int, default=0, metavar="K",
                    help="verify the persistent grids (PF 1, 2, 3) again on at most K blocks")
    a = ap.parse_args()
    t0 = time.time()
    for name in a.ops.split(","):
        r = Range(name, ROOT / SPECS[name])
        if a.only:
            from runner.spec.spec import restrict

            try:
                r.spec = restrict(r.spec, a.only)
            except ValueError as e:
                ap.error(f"{name}: {e}")
            r.configs = list(r.spec.space)
            r.restricted = True
        if a.compile_only:
            check_static(r, a.nvcc)
        else:
            check_gpu(r, a.per_bucket, a.sizes, [1, 3, 37, 4096], not a.no_timing, a.all,
                      [int(x) for x in a.sweep.split(",") if x], a.top, a.rows or None, a.grid_cap)
    if not a.compile_only and not a.no_assert and "cross-entropy" in a.ops:
        check_assert()
    print(f"\n{len(FAILURES)} failure(s) in {time.time() - t0:.0f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
