"""The MoE grouped GEMM (issue 22) on one GPU, outside the loop: correctness on skewed routings
and speed of the template's configurations beside the expert loop and torch._grouped_mm.

    python tools/moe_probe.py                         # every MoE spec, a sample of configurations
    python tools/moe_probe.py --spec pipelines/moe-fine-h200.yaml --all
    python tools/moe_probe.py --only BM=16 --only SPLITK=1,2
    python tools/moe_probe.py --dry-run --all         # no GPU: every configuration of every spec
    python tools/moe_probe.py --dry-run --all --nvcc  # ... and nvcc for sm_90a as well
    python tools/moe_probe.py --only MMA=wgmma --points 1024,4096   # the Hopper path only
    python tools/moe_probe.py --spec pipelines/moe-coarse-h200.yaml --arms-only --no-verify \
        --points 1600,1700,1800 --draws 4              # the library arms on four routings a T

Everything is pipe's own: the spec (through tools/moe_spec.py while the reference side's keys
are not in the loader yet), the Builder (render, source rules, NVRTC, spills, launch limits via
tools/space_check.py), the CUDA Runtime (cuda.core launches, the L2 flush and the timer). The
float64 answer and its error budget are this tool's (tools/moe_spec.py: grouped_ref), not the
judge's. The probe owns the workspace: zeroed once, checked zero after every call, and reused
by the second call of each check (which must give the same bits: the split-K sum is ordered).

1. Verify: every configuration (or --sample of them) on routings that stress the tile lookup:
   T = 1, every row on one expert (the first, a middle one, the last), empty experts, one row
   a group, ragged group sizes that are no multiple of any tile, uniform routings, at T from 1
   to 300; y starts as NaN (a row never written shows), the workspace zero after each call.
2. Speed at T = 1, 16, 128, 1024, 4096 (uniform routing, L2 flushed before each call, the
   median of --reps calls, CUDA graph replay where a call is under 20 us): the expert loop (its
   group bounds read on the host beforehand, outside the timing), torch._grouped_mm (SwiGLU:
   plus the activation in torch), a read of the active experts' weights alone (the read floor:
   a Triton kernel, the best of a few block sizes), then each configuration the spec serves there; microseconds,
   TB/s of the active experts' weights and TFLOP/s; the best five a point, and a summary.
--dry-run runs what needs no GPU: the specs, render, the source rules, NVRTC (no spills, the
launch limits, no external calls), the kernel's parameters (from its PTX) against the packed
arguments, the launch geometry and workspace of every point against the host model of the
tile lookup, and that model's coverage of every row on the probe's routings. Exit status 1 on
any failure.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from moe_spec import (PIPELINES, SPECS, active_experts, coverage, grid_size, grouped_ref,  # noqa: E402
                      load_moe_spec, mt_bound, routing)

FAILURES: list[str] = []
POINTS = [1, 16, 128, 1024, 4096]
# (T, routing) pairs verified: every kind at small T, ragged and uniform larger
VERIFY = [(1, "uniform"), (1, "one"), (1, "last"), (2, "single"), (3, "first"), (5, "ragged"), (11, "single"),
          (16, "uniform"), (16, "empty"), (37, "ragged"), (64, "one"), (64, "last"), (100, "empty"),
          (128, "uniform"), (201, "ragged"), (300, "uniform")]
PARAMS = ("MMA", "BM", "BN", "BK", "WM", "WN", "STAGES", "SPLITK", "GM", "PERSIST")


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print(f"FAIL {msg}", flush=True)


def label(cfg: dict) -> str:
    return " ".join(f"{k}={cfg[k]}" for k in PARAMS if k in cfg)


class Probe:
    """One spec's kernels: render, compile, pack, launch. `device` False: no CUDA runtime."""

    def __init__(self, path: Path, device: bool = True):
        import torch

        from runner.build.backends import cuda

        self.torch = torch
        self.ms = load_moe_spec(path)
        self.spec = self.ms.spec
        self.name = self.spec.name
        self.sz = self.ms.sizes
        self.act = self.sz["ACT"]
        self.rt = cuda.Runtime(self.spec.hw, self.spec.runtime) if device else None
        self.dev = "cuda" if device else "cpu"
        self.ptr_names = {t.name for t in (*self.spec.op.inputs, *self.spec.op.outputs)} | \
            {s.name for s in self.spec.kernel.scratch}
        self.map_names = {m.name for m in self.spec.kernel.tensor_maps}  # TMA descriptors, by value
        self.kinds = [("tmap" if a in self.map_names else "ptr" if a in self.ptr_names else cuda.Runtime.symbol_type)
                      for a in self.spec.kernel.args]
        self.b = None
        if self.ms.standin:
            print(f"{self.name}: loaded through the stand-in op section (the reference side's keys are not "
                  "in pipe's loader yet)", flush=True)

    @property
    def nout(self) -> int:
        return self.sz["N"] // 2 if self.act == "swiglu" else self.sz["N"]

    def env(self, cfg: dict, T: int) -> dict:
        env = {"T": T, **cfg}
        env.update(self.spec.kernel.derived(env))
        return env

    def served(self, cfg: dict, T: int) -> bool:
        return self.spec.kernel.serves_shape(cfg, {"T": T}, 2)

    def compile(self, cfgs: list[dict], nvcc: bool = False) -> list:
        """[(cfg, cubin path, resources)] for every configuration that compiles clean."""
        from space_check import compile_space, nvcc_all

        t0 = time.time()
        b, compiled, owners = compile_space(self.spec, cfgs, [{"T": 1}, {"T": 4093}], {"T": 4096}, fail, label)
        self.b = b
        by_src = {}
        for cfg, c in compiled:
            by_src[b.render_all(cfg, shapes=[{"T": 1}])[0]] = c
        keep = []
        for src, group in owners.items():
            c = by_src.get(src)
            if c is not None:
                keep += [(cfg, c.artifact, c.resources) for cfg in group]
        order = {label(c): i for i, c in enumerate(cfgs)}
        keep.sort(key=lambda k: order[label(k[0])])
        regs = [r.get("registers", 0) for _, _, r in keep]
        arch = next((o.split("=", 1)[1] for o in self.spec.kernel.options if re.match(r"^--?arch=", o)),
                    self.spec.hw.arch)  # kernel.options' --arch= wins over the profile's (runner/build/backends/cuda.py)
        print(f"{self.name}: {len(keep)} of {len(cfgs)} configurations compiled ({len(owners)} sources, NVRTC "
              f"{arch}) in {time.time() - t0:.0f} s; registers {min(regs, default=0)} .. "
              f"{max(regs, default=0)}, no spills", flush=True)
        fam = defaultdict(list)
        for cfg, _, r in keep:
            fam[(cfg["MMA"], cfg["BM"], cfg["BN"], cfg["WM"], cfg["WN"])].append(r.get("registers", 0))
        print(f"  {'MMA':>5} {'BM':>4} {'BN':>4} {'WM':>3} {'WN':>3}  registers")
        for k in sorted(fam):
            print(f"  {k[0]:>5} {k[1]:>4} {k[2]:>4} {k[3]:>3} {k[4]:>3}  {min(fam[k])} .. {max(fam[k])}")
        # ptxas serializes wgmma (and says so in a warning) when the accumulators are touched
        # between the MMAs of a group or it runs short of registers: not a failure of the build,
        # but the path's point gone
        for cfg, c in compiled:
            if cfg["MMA"] != "sync" and re.search(r"warning|wgmma", c.log or "", re.I):
                fail(f"{self.name} {label(cfg)}: ptxas warns: "
                     f"{next(ln for ln in c.log.splitlines() if re.search('warning|wgmma', ln, re.I))[:200]}")
        if nvcc:
            nvcc_all(owners, fail, label)
        return keep

    def pack(self, cfg: dict, T: int, tensors: dict, maps: bool = True):
        """The kernel's arguments and launch geometry: pointers, T, and each tensor map built on
        its tensor where the configuration reads it (the geometry holds its box; `when`), a
        placeholder where it does not (the runner's own helpers); `maps` False (no device, meta
        tensors): None in a map's place."""
        from runner.ship.exported_runtime import placeholder_map, tensor_map

        geo = self.b.geometry(cfg, [{"T": T}])[0]
        boxes = geo.get("tensor_maps") or {}
        by = {m.name: m for m in self.spec.kernel.tensor_maps}
        vals = []
        for a in self.spec.kernel.args:
            if a in by:
                if not maps:
                    vals.append(None)
                    continue
                m, t = by[a], tensors[by[a].tensor]
                vals.append(tensor_map(t, boxes[a], m.swizzle, m.dtype) if a in boxes else placeholder_map(t.device))
            else:
                vals.append(tensors[a].data_ptr() if a in self.ptr_names else T)
        return vals, geo

    def ws_shape(self, cfg: dict, T: int) -> list[int]:
        return self.spec.kernel.scratch_shapes(self.env(cfg, T))["ws"]

    def prepare(self, cfg, art, T, tensors, mode="direct"):
        fn = self.rt.load(art, self.spec.kernel.entry, self.kinds)
        vals, geo = self.pack(cfg, T, tensors)
        return self.rt.prepare(fn, vals, geo, mode=mode)

    # -- data ------------------------------------------------------------------------------------
    def weights(self, seed: int = 0):
        torch = self.torch
        g = torch.Generator(device=self.dev)
        g.manual_seed(seed)
        E, N, K = self.sz["E"], self.sz["N"], self.sz["K"]
        w = torch.empty(E, N, K, device=self.dev, dtype=torch.bfloat16)
        for e in range(E):  # one expert at a time: no fp32 copy of the whole weight
            w[e] = (torch.randn(N, K, generator=g, device=self.dev) * K ** -0.5).bfloat16()
        return w

    def tokens(self, T: int, seed: int):
        torch = self.torch
        g = torch.Generator(device=self.dev)
        g.manual_seed(1000 + seed)
        x = torch.randn(T * self.sz["TOPK"], self.sz["K"], generator=g, device=self.dev)
        if seed % 3 == 1:  # a few large rows and outliers
            x[:: 7] *= 16
        return x.bfloat16()


def sample_configs(p: Probe, a) -> list[dict]:
    from space_check import sample_configs as sample

    return sample(p.spec, a.only, a.all, a.sample)


def entry_params(p: Probe, src: str) -> list[int]:
    """The byte sizes of the entry's parameters (tools/space_check.py)."""
    from space_check import entry_params as params

    return params(p.spec, src)


def dry_run(p: Probe, keep: list) -> None:
    """The kernel's parameters against the packed arguments; every point's geometry and
    workspace against the host model; the host model's coverage on the probe's routings."""
    import torch

    if not keep:
        return
    sizes = entry_params(p, p.b.render_all(keep[0][0], shapes=[{"T": 1}])[0])
    want = [128 if a in p.map_names else 8 if a in p.ptr_names else 4 for a in p.spec.kernel.args]
    if sizes != want:
        fail(f"{p.name}: the kernel's parameters are {sizes} bytes, the probe packs {want} ({p.spec.kernel.args})")
    sz = p.sz
    npack = 0
    for T in sorted(set(POINTS + [t for t, _ in VERIFY] + [8192])):
        R = T * sz["TOPK"]
        meta = {"x": torch.empty(R, sz["K"], device="meta"), "w": torch.empty(1, device="meta"),
                "offs": torch.empty(sz["E"], device="meta"), "y": torch.empty(R, p.nout, device="meta")}
        for cfg, _, res in keep:
            ws = p.ws_shape(cfg, T)
            vals, geo = p.pack(cfg, T, {**meta, "ws": torch.empty(1, device="meta")}, maps=False)
            threads = cfg["WM"] * cfg["WN"] * 32 + (128 if cfg["MMA"] == "wgmma_tma_ws" else 0)
            smem = cfg["STAGES"] * (cfg["BM"] + cfg["BN"]) * cfg["BK"] * 2 + (1024 if cfg["MMA"] != "sync" else 0) \
                + (cfg["BM"] * min(cfg["BN"], 128) * 2 if cfg.get("PERSIST") else 0)  # PERSIST's staging
            if len(vals) != len(sizes) or geo["grid"] != [grid_size(T, cfg)] or geo["block"] != [threads] \
                    or geo["shared_mem"] != smem:
                fail(f"{p.name} {label(cfg)} T={T}: packed {len(vals)} arguments, geometry {geo}")
            nt = sz["N"] // cfg["BN"]
            wsw = 1 if cfg["SPLITK"] == 1 else -(-mt_bound(T, cfg) * nt // 4) * 4 + cfg["SPLITK"] * R * sz["N"]
            if ws != [wsw]:
                fail(f"{p.name} {label(cfg)} T={T}: workspace {ws}, the kernel addresses {wsw} floats")
            if geo["grid"][0] >= 2 ** 31:
                fail(f"{p.name} {label(cfg)} T={T}: grid {geo['grid']}")
            npack += 1
    print(f"{p.name}: parameters {sizes} bytes match the arguments; {npack} launches packed (geometry and "
          "workspace checked)", flush=True)
    # the tile lookup's host model on the verify routings, for one configuration of each (BM, BN, GM, SPLITK)
    t0, n = time.time(), 0
    fams = {}
    for cfg, _, _ in keep:
        fams.setdefault((cfg["BM"], cfg["BN"], cfg["GM"], cfg["SPLITK"]), cfg)
    for cfg in fams.values():
        for T, kind in VERIFY:
            offs = routing(kind, T, sz["E"], sz["TOPK"], seed=T)
            why = coverage(offs, T, cfg)
            n += 1
            if why:
                fail(f"{p.name} {label(cfg)} T={T} {kind}: {why}")
    print(f"{p.name}: the tile lookup covers every row once in {n} (configuration, routing) cases "
          f"({time.time() - t0:.0f} s)", flush=True)


def verify(p: Probe, keep: list) -> None:
    torch = p.torch
    sz = p.sz
    w = p.weights()
    t0 = time.time()
    cases = []
    for i, (T, kind) in enumerate(VERIFY):
        offs = routing(kind, T, sz["E"], sz["TOPK"], seed=i)
        x = p.tokens(T, i)
        ot = torch.tensor(offs, dtype=torch.int32, device="cuda")
        ref, bound = grouped_ref(x, w, ot, p.act)
        cases.append((T, kind, x, ot, ref, bound))
    print(f"{p.name}: {len(cases)} float64 answers in {time.time() - t0:.0f} s", flush=True)
    t0 = time.time()
    n = 0
    for cfg, art, res in keep:
        bad = 0
        for T, kind, x, ot, ref, bound in cases:
            y = torch.full((T * sz["TOPK"], p.nout), float("nan"), device="cuda").bfloat16()
            ws = torch.zeros(*p.ws_shape(cfg, T), device="cuda")
            try:
                call = p.prepare(cfg, art, T, {"x": x, "w": w, "offs": ot, "y": y, "ws": ws})
                call()
                torch.cuda.synchronize()
                y1 = y.clone()
                nz1 = int(torch.count_nonzero(ws))
                y.fill_(float("nan"))
                call()  # the same workspace, left zero by the first call
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a fault spoils the context
                fail(f"{p.name} {label(cfg)} T={T} {kind}: launch failed: {type(e).__name__}: {e}")
                raise SystemExit(1)
            n += 1
            why = None
            err = (y1.double() - ref).abs()
            if torch.isnan(y1).any():
                rows = torch.isnan(y1).any(dim=1).nonzero().flatten().tolist()
                why = f"NaN (rows never written?) in {len(rows)} rows, first {rows[:6]}"
            elif (err > bound).any():
                idx = int(torch.argmax(err / bound))
                r, c = divmod(idx, p.nout)
                why = (f"{int((err > bound).sum())} elements outside the budget; worst y[{r}, {c}] = "
                       f"{float(y1[r, c]):.6g}, want {float(ref[r, c]):.6g} +- {float(bound[r, c]):.3g}")
            elif nz1 or int(torch.count_nonzero(ws)):
                why = f"workspace not zero after the call ({nz1} then {int(torch.count_nonzero(ws))} nonzero words)"
            elif not torch.equal(y.view(torch.int16), y1.view(torch.int16)):
                why = "a second call on the same workspace gave other bits"
            if why:
                bad += 1
                fail(f"{p.name} {label(cfg)} T={T} {kind} (offs {ot.tolist()[:8]}...): {why}")
        print(f"  verified {label(cfg)}: regs {res.get('registers')} {'ok' if not bad else 'FAILED'}", flush=True)
    print(f"{p.name}: {n} launches verified in {time.time() - t0:.0f} s", flush=True)
    del w, cases
    torch.cuda.empty_cache()


def arms(p: Probe, x, w, offs_list, ot):
    """The expert loop (the group bounds on the host, read beforehand) and torch._grouped_mm,
    with the SwiGLU activation in torch for that spec."""
    torch = p.torch
    import torch.nn.functional as F

    bounds = []
    prev = 0
    for e, o in enumerate(offs_list):
        if o > prev:
            bounds.append((e, prev, o))
        prev = o
    N = p.sz["N"]
    h = torch.empty(x.shape[0], N, device="cuda", dtype=torch.bfloat16)

    def act(hh):
        return hh if p.act == "none" else F.silu(hh[:, : N // 2]) * hh[:, N // 2:]

    def loop():
        for e, a, b in bounds:
            torch.mm(x[a:b], w[e].T, out=h[a:b])
        return act(h)

    wt = w.transpose(1, 2)

    def grouped():
        return act(torch._grouped_mm(x, wt, offs=ot))

    out = {"loop": loop}
    try:
        grouped()
        torch.cuda.synchronize()
        out["grouped_mm"] = grouped
    except Exception as e:  # noqa: BLE001
        print(f"    torch._grouped_mm: n/a ({type(e).__name__}: {str(e).splitlines()[0][:90]})")
    return out


# The read floor: the active experts' weights read once and nothing else, by a Triton kernel
# (the best of READ_CONFIGS at each point), in the same timing as the kernels. A weight-streaming
# kernel at small T can at best match it: what it takes above the floor is its own; what the
# floor takes above bytes / read bandwidth is the launch, the ramp and the tail of any read.
READ_CONFIGS = [(b, c, nw) for b in (2048, 4096, 8192) for c in (1, 2, 4) for nw in (4, 8)]

try:
    import triton
    import triton.language as tl

    @triton.jit
    def _read(w_ptr, ex_ptr, out_ptr, PER: tl.constexpr, BLOCK: tl.constexpr, CH: tl.constexpr):
        pid = tl.program_id(0)
        e = tl.load(ex_ptr + tl.program_id(1)).to(tl.int64)
        base = w_ptr + e * PER + pid.to(tl.int64) * (BLOCK * CH)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in tl.static_range(CH):
            acc += tl.load(base + i * BLOCK + tl.arange(0, BLOCK)).to(tl.int32)
        tl.store(out_ptr + tl.program_id(1) * tl.num_programs(0) + pid, tl.sum(acc, axis=0))
except ImportError:  # the probe's other arms need no Triton
    _read = None


def read_floor(p: Probe, w, offs_list):
    """{"read floor": call} reading every active expert's weight once (an int32 sum a program,
    so the loads stay), or {} without Triton; the call is the fastest of READ_CONFIGS."""
    torch = p.torch
    if _read is None:
        return {}
    ex, prev = [], 0
    for e, o in enumerate(offs_list):
        if o > prev:
            ex.append(e)
        prev = o
    per = p.sz["N"] * p.sz["K"]
    wi = w.view(torch.int16)
    ext = torch.tensor(ex, dtype=torch.int32, device="cuda")
    best = None
    for blk, ch, nw in READ_CONFIGS:
        if per % (blk * ch):
            continue
        g = per // (blk * ch)
        out = torch.empty(len(ex) * g, dtype=torch.int32, device="cuda")

        def call(g=g, out=out, blk=blk, ch=ch, nw=nw):
            _read[(g, len(ex))](wi, ext, out, PER=per, BLOCK=blk, CH=ch, num_warps=nw)

        t = timed(p, p.rt.prepare_torch(call, mode="auto"), 10)
        if best is None or t < best[0]:
            best = (t, call)
    if not best:
        return {}
    return {"read floor": p.rt.prepare_torch(best[1], mode="auto"), **stride_floor(p, w, len(ex))}


def stride_floor(p: Probe, w, n_experts: int) -> dict:
    """{"read floor, grid-stride": call}: the same bytes (the first `n_experts` experts'
    weights, contiguous) read once by `pipe hw`'s kernel (16-byte non-caching loads, four in
    flight a thread), the fastest of its geometries; a second opinion on the Triton floor."""
    from runner.spec.measure import READ_GEOMETRIES, READ_KERNEL, cubin_file

    torch = p.torch
    props = torch.cuda.get_device_properties(0)
    fn = p.rt.load(cubin_file(READ_KERNEL, f"sm_{props.major}{props.minor}", "readk"), "readk", ["ptr", "i64", "ptr"])
    out = torch.zeros(1, device="cuda", dtype=torch.int32)
    nbytes = n_experts * p.sz["N"] * p.sz["K"] * 2
    best = None
    for per_sm, threads in READ_GEOMETRIES:
        call = p.rt.prepare(fn, [w.data_ptr(), nbytes // 16, out.data_ptr()],
                            {"grid": [props.multi_processor_count * per_sm], "block": [threads], "shared_mem": 0},
                            mode="auto")
        t = timed(p, call, 10)
        if best is None or t < best[0]:
            best = (t, call, per_sm, threads)
    print(f"{p.name}: grid-stride read of {nbytes / 1e6:.1f} MB: best at {best[2]} blocks an SM of {best[3]}",
          flush=True)
    return {"read floor, grid-stride": best[1]}


# A warp a (row, NPW weight rows) dot product, K read in 16-byte non-caching loads, every load of
# an item issued before any is used (NPW * K / 256 a lane in flight): the weight stream of a
# GEMV at small T, with none of the tile's zero-filled rows or pipeline barriers. A probe of
# what a kernel that reads like the grid-stride floor does at T <= 4, not a template path yet.
GEMV_KERNEL = r'''
typedef unsigned short bf16;  // the bits: no header (NVRTC has no include path here)
extern "C" __global__ void __launch_bounds__(256) gemv(const bf16* __restrict__ x,
    const bf16* __restrict__ w, const int* __restrict__ offs, bf16* __restrict__ y, int R) {
  const int lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, nw = (gridDim.x * blockDim.x) >> 5;
  const int per_row = GN / NPW;
  for (int it = gw; it < R * per_row; it += nw) {
    const int r = it / per_row, n0 = (it - r * per_row) * NPW;
    int e = GE;  // the first expert whose cumulative end passes r
    for (int b = 0; b < GE; b += 32) {
      const unsigned m = __ballot_sync(0xffffffffu, b + lane < GE && offs[b + lane] > r);
      if (m) { e = b + __ffs(m) - 1; break; }
    }
    uint4 wv[NPW][GK / 256];
    const uint4* wr = reinterpret_cast<const uint4*>(w + ((long long)e * GN + n0) * GK) + lane;
#pragma unroll
    for (int j = 0; j < NPW; ++j)
#pragma unroll
      for (int i = 0; i < GK / 256; ++i)
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(wv[j][i].x), "=r"(wv[j][i].y), "=r"(wv[j][i].z), "=r"(wv[j][i].w)
                     : "l"(wr + j * (GK / 8) + i * 32));
    const uint4* xr = reinterpret_cast<const uint4*>(x + (long long)r * GK) + lane;
    float acc[NPW];
#pragma unroll
    for (int j = 0; j < NPW; ++j) acc[j] = 0.f;
#pragma unroll
    for (int i = 0; i < GK / 256; ++i) {
      const uint4 xv = __ldg(xr + i * 32);
      const unsigned xs[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
      for (int j = 0; j < NPW; ++j) {
        const unsigned ws[4] = {wv[j][i].x, wv[j][i].y, wv[j][i].z, wv[j][i].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc[j] = fmaf(__uint_as_float(xs[q] << 16), __uint_as_float(ws[q] << 16), acc[j]);
          acc[j] = fmaf(__uint_as_float(xs[q] & 0xffff0000u), __uint_as_float(ws[q] & 0xffff0000u), acc[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < NPW; ++j) {
#pragma unroll
      for (int o = 16; o; o >>= 1) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    }
    if (lane == 0)
#pragma unroll
      for (int j = 0; j < NPW; ++j) {  // to nearest, ties to even (finite sums)
        const unsigned b = __float_as_uint(acc[j]);
        y[(long long)r * GN + n0 + j] = (bf16)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
      }
  }
}
'''
GEMV_SHAPES = [(npw, per_sm) for npw in (1, 2, 4) for per_sm in (2, 4, 8)]


def gemv_arm(p: Probe, x, w, offs: list[int], ot, T: int) -> dict:
    """{"gemv probe": call}: GEMV_KERNEL, the fastest of GEMV_SHAPES within the float64 answer's
    budget (tools/moe_spec.grouped_ref), at T <= 4 with no activation; {}
    elsewhere. Prints each shape's time, and any that is wrong."""
    from runner.spec.measure import cubin_file

    torch, sz = p.torch, p.sz
    if T > 4 or p.act != "none":
        return {}
    R = T * sz["TOPK"]
    ref, bound = grouped_ref(x, w, offs, p.act)
    props = torch.cuda.get_device_properties(0)
    best = None
    for npw, per_sm in GEMV_SHAPES:
        if sz["N"] % npw or sz["K"] % 256:
            continue
        src = (f"#define GN {sz['N']}\n#define GK {sz['K']}\n#define GE {sz['E']}\n#define NPW {npw}\n"
               + GEMV_KERNEL)
        fn = p.rt.load(cubin_file(src, f"sm_{props.major}{props.minor}", "gemv"), "gemv",
                       ["ptr", "ptr", "ptr", "ptr", "i32"])
        y = torch.full((R, sz["N"]), float("nan"), device="cuda", dtype=torch.bfloat16)
        call = p.rt.prepare(fn, [x.data_ptr(), w.data_ptr(), ot.data_ptr(), y.data_ptr(), R],
                            {"grid": [props.multi_processor_count * per_sm], "block": [256], "shared_mem": 0},
                            mode="auto")
        call()
        torch.cuda.synchronize()
        err = (y.double() - ref).abs()
        if not bool((err <= bound).all()):
            FAILURES.append(f"{p.name}: gemv probe NPW {npw} at T {T}: wrong (max error {float(err.max()):.3g})")
            print(f"{p.name}: gemv probe NPW {npw} {per_sm}/SM at T {T}: WRONG", flush=True)
            continue
        t = timed(p, call, 10)
        print(f"{p.name}: gemv probe NPW {npw}, {per_sm} blocks of 256 an SM, T {T}: {t * 1e6:.2f} us", flush=True)
        if best is None or t < best[0]:
            best = (t, call, y)
    return {"gemv probe": best[1]} if best else {}


def timed(p: Probe, call, reps: int) -> float:
    from space_check import median_time

    return median_time(p.rt, call, reps)


def draw_rows(offs: list[int]) -> tuple[int, int]:
    """The fewest and the most rows an expert in use gets under the cumulative ends `offs`."""
    counts = [b - a for a, b in zip([0, *offs[:-1]], offs)]
    live = [c for c in counts if c] or [0]
    return min(live), max(live)


def speed(p: Probe, keep: list, reps: int, points: list[int], draws: int = 1, arms_only: bool = False) -> list:
    torch = p.torch
    sz = p.sz
    w = p.weights()
    wbytes = sz["N"] * sz["K"] * 2  # an expert's weight
    summary = []
    print(f"\n{p.name}: {'T':>5} {'experts':>7}  arm: us, TB/s of the active experts' weights, TFLOP/s")
    for T, d in ((T, d) for T in points for d in range(draws)):
        offs = routing("uniform", T, sz["E"], sz["TOPK"], seed=7 + d)
        act_e = active_experts(offs)
        if draws > 1:  # several routings of one T: which rows an expert each draw gave
            lo, hi = draw_rows(offs)
            print(f"{p.name}: T {T} draw {d}: {lo} to {hi} rows an expert", flush=True)
        byts = act_e * wbytes
        flops = 2 * T * sz["TOPK"] * sz["N"] * sz["K"]
        x = p.tokens(T, 0)
        ot = torch.tensor(offs, dtype=torch.int32, device="cuda")

        def fmt(t):
            return f"{t * 1e6:8.1f} us {byts / t / 1e12:5.2f} TB/s {flops / t / 1e12:6.1f} TFLOP/s"

        line = []
        base = {}
        calls = {n: p.rt.prepare_torch(f, mode="auto") for n, f in arms(p, x, w, offs, ot).items()}
        for name, call in {**calls, **read_floor(p, w, offs), **gemv_arm(p, x, w, offs, ot, T)}.items():
            t = timed(p, call, reps)
            base[name] = t
            line.append(f"{name} {fmt(t)}")
        print(f"{p.name}: {T:>5} {act_e:>7}  " + " | ".join(line), flush=True)
        rows = []
        y = torch.empty(T * sz["TOPK"], p.nout, device="cuda", dtype=torch.bfloat16)
        for cfg, art, _ in ([] if arms_only else keep):
            if not p.served(cfg, T):
                continue
            ws = torch.zeros(*p.ws_shape(cfg, T), device="cuda")
            call = p.prepare(cfg, art, T, {"x": x, "w": w, "offs": ot, "y": y, "ws": ws}, mode="auto")
            rows.append((timed(p, call, reps), cfg))
            del ws
        rows.sort(key=lambda r: r[0])
        for t, cfg in rows[:5]:
            print(f"          {fmt(t)}  {label(cfg)}", flush=True)
        if rows:
            summary.append((p.name, T, rows[0][0], base, byts, flops, rows[0][1]))
        del x, y
        torch.cuda.empty_cache()
    del w
    torch.cuda.empty_cache()
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", action="append", default=[], help="a spec (repeatable; default every MoE spec)")
    ap.add_argument("--all", action="store_true", help="every configuration (default: a sample)")
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--only", action="append", default=[], metavar="NAME=V1,V2")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--points", default=",".join(map(str, POINTS)), help="T values timed (comma-separated)")
    ap.add_argument("--draws", type=int, default=1,
                    help="uniform routings timed at each T (seeds 7, 8, ...): whether an arm's time follows T or the draw")
    ap.add_argument("--arms-only", action="store_true", help="time the arms (loop, grouped_mm, Triton, read floor) only")
    ap.add_argument("--nvcc", action="store_true", help="with --dry-run: nvcc -arch=sm_90a as well")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: render, compile, pack, the tile model")
    a = ap.parse_args(argv)
    paths = [Path(s) for s in a.spec] or [PIPELINES / s for s in SPECS]
    summary = []
    for path in paths:
        p = Probe(path, device=not a.dry_run)
        keep = [] if a.arms_only else p.compile(sample_configs(p, a), nvcc=a.nvcc and a.dry_run)
        print(f"  (of {sum(1 for _ in p.spec.space)} in the space)", flush=True)
        if a.dry_run:
            dry_run(p, keep)
            continue
        if not a.no_verify and keep:
            verify(p, keep)
        if a.no_timing or FAILURES:
            continue
        summary += speed(p, keep, a.reps, [int(t) for t in a.points.split(",")], a.draws, a.arms_only)
    if summary:
        print("\nsummary: the best configuration a point, against the arms")
        for name, T, t, base, byts, flops, cfg in summary:
            arms_s = " ".join(f"{k} x{b / t:.2f}" for k, b in base.items())
            print(f"  {name:<22} T={T:<5} {t * 1e6:8.1f} us {byts / t / 1e12:5.2f} TB/s {flops / t / 1e12:6.1f} "
                  f"TFLOP/s  speedup {arms_s}  {label(cfg)}")
    print(f"\n{len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
