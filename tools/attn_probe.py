"""Decode attention (issue 21) on one GPU, outside the loop: correctness, determinism and speed
of the template's configurations beside torch's SDPA backends.

    python tools/attn_probe.py                    # a sample of configurations, all checks
    python tools/attn_probe.py --all              # every configuration of the spec
    python tools/attn_probe.py --only SPLIT=512 --only NW=4

Everything is pipe's own: the spec (pipelines/decode-attention-h200.yaml), the Builder (render,
source rules, NVRTC), the CUDA Runtime (cuda.core launches), the float64 reference and the judge's
error budget. The probe owns the workspace: zeroed once, and checked zero after every call.

1. Verify: every configuration at ragged lengths (lens in [1, L]) on small batches, partial splits
   and tiles, L = 1 .. 131071 (shapes it serves), outputs inside guard bands, the workspace zero
   after each call.
2. Determinism: a sequence's output bitwise the same alone and inside a batch of others, and on
   a second call.
3. Speed: each configuration at (B, L) points (every sequence at L, L2 flushed before each call,
   the median of 30 calls, CUDA graph replay, events with a device spin ahead of the start event), in TB/s of
   K and V read, beside SDPA flash, cuDNN, efficient (no mask: every sequence at L) and the
   masked SDPA reference; the best five configurations a point.
Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPEC = ROOT / "pipelines/decode-attention-h200.yaml"
FAILURES: list[str] = []
VERIFY = [(3, 128), (3, 129), (2, 200), (5, 1021), (1, 1024), (7, 4099), (2, 8192), (3, 40000), (1, 131071)]
POINTS = [(1, 1024), (1, 8192), (1, 32768), (1, 131072), (4, 4096), (8, 8192), (8, 32768), (16, 32768),
          (16, 2048), (32, 1024), (32, 8192), (64, 1024)]


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print(f"FAIL {msg}", flush=True)


def label(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("HKV", "GROUP"))


class Probe:
    def __init__(self, spec_path: Path):
        import torch

        from runner.build.backends import cuda
        from runner.build.builder import Builder
        from runner.spec.spec import load_spec

        self.torch = torch
        self.spec = load_spec(spec_path)
        self.op = self.spec.op
        self.b = Builder(self.spec)
        self.rt = cuda.Runtime(self.spec.hw, self.spec.runtime)
        names = {t.name for t in (*self.op.inputs, *self.op.outputs)} | {s.name for s in self.spec.kernel.scratch}
        self.kinds = [("ptr" if a in names else self.rt.symbol_type) for a in self.spec.kernel.args]
        self.serves = self.spec.kernel.serves

    def env(self, cfg: dict, shape: dict) -> dict:
        env = {**shape, **cfg}
        env.update(self.spec.kernel.derived(env))
        return env

    def served(self, cfg: dict, shape: dict) -> bool:
        s = self.serves
        return True if s is None else bool(s(self.env(cfg, shape)))

    def ws_row(self, shape: dict, cfg: dict) -> int:
        from runner.ops.reference import decode_attention_ws_row

        return decode_attention_ws_row(shape["L"], cfg["GROUP"])

    def inputs(self, B: int, L: int, seed: int, ragged: bool):
        torch = self.torch
        g = torch.Generator(device="cuda")
        g.manual_seed(seed)
        q = torch.randn(B, 32, 128, generator=g, device="cuda").bfloat16()
        k = torch.randn(B, L, 8, 128, generator=g, device="cuda").bfloat16()
        v = torch.randn(B, L, 8, 128, generator=g, device="cuda").bfloat16()
        if seed % 3 == 1:  # large scores: the softmax's max matters
            q = (q.float() * 4).bfloat16()
        if ragged:
            lens = torch.randint(1, L + 1, (B,), generator=g, device="cuda", dtype=torch.int32)
            lens[0] = L
        else:
            lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
        return q, k, v, lens

    def prepare(self, cfg: dict, art, shape: dict, q, k, v, lens, out, ws, mode: str = "direct"):
        fn = self.rt.load(art, self.spec.kernel.entry, self.kinds)
        ptrs = {"q": q, "k": k, "v": v, "lens": lens, "out": out, "ws": ws}
        vals = [ptrs[a].data_ptr() if a in ptrs else shape[a] for a in self.spec.kernel.args]
        geo = self.b.geometry(cfg, [shape])[0]
        return self.rt.prepare(fn, vals, geo, mode=mode)

    def run_once(self, cfg, art, B, L, q, k, v, lens):
        torch = self.torch
        shape = {"B": B, "L": L}
        out = torch.full((B, 32, 128), float("nan"), device="cuda").bfloat16()
        ws = torch.zeros(B, 8, self.ws_row(shape, cfg), device="cuda")
        self.prepare(cfg, art, shape, q, k, v, lens, out, ws)()
        torch.cuda.synchronize()
        nz = torch.nonzero(ws.view(torch.int32).flatten())
        return out, (None if nz.numel() == 0 else int(nz[0]))

    def verify(self, cfg, art, B, L, seed) -> str | None:
        from runner.judge.verify import Budget, compare
        from runner.ops.reference import decode_attention

        q, k, v, lens = self.inputs(B, L, seed, ragged=True)
        out, nz = self.run_once(cfg, art, B, L, q, k, v, lens)
        if nz is not None:
            return f"workspace not zero after the call (first nonzero float {nz})"
        ref = decode_attention(q.double(), k.double(), v.double(), lens)
        ok, why, _ = compare(out, ref, self.op.atol, self.op.rtol,
                             Budget(ref, self.op.atol, self.op.rtol, self.torch.bfloat16, self.op.ulps, self.op.floor))
        return None if ok else f"{why} (lens {lens.tolist()[:8]})"

    def deterministic(self, cfg, art, seed) -> str | None:
        torch = self.torch
        B, L = 6, 5000
        q, k, v, lens = self.inputs(B, L, seed, ragged=True)
        a, _ = self.run_once(cfg, art, B, L, q, k, v, lens)
        a2, _ = self.run_once(cfg, art, B, L, q, k, v, lens)
        if not torch.equal(a.view(torch.int16), a2.view(torch.int16)):
            return "two calls differ"
        for b in (1, 4):
            o, _ = self.run_once(cfg, art, 1, L, q[b:b + 1].contiguous(), k[b:b + 1].contiguous(),
                                 v[b:b + 1].contiguous(), lens[b:b + 1].contiguous())
            if not torch.equal(o[0].view(torch.int16), a[b].view(torch.int16)):
                return f"sequence {b} alone differs from the batch"
        # the same sequence inside a larger L buffer (other splits count, same tokens)
        L2 = 9000
        k2 = torch.randn(1, L2, 8, 128, device="cuda").bfloat16()
        v2 = torch.randn(1, L2, 8, 128, device="cuda").bfloat16()
        k2[:, :L] = k[1:2]
        v2[:, :L] = v[1:2]
        o, _ = self.run_once(cfg, art, 1, L2, q[1:2].contiguous(), k2, v2, lens[1:2].contiguous())
        if not torch.equal(o[0].view(torch.int16), a[1].view(torch.int16)):
            return "a sequence in a longer buffer differs"
        return None

    def time(self, call, reps: int = 30) -> float:
        torch = self.torch
        call()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            self.rt.flush()
            torch.cuda._sleep(100_000)
            a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            e.record()
            e.synchronize()
            ts.append(a.elapsed_time(e) / 1e3)
        ts.sort()
        return ts[len(ts) // 2]

    def sdpa_arms(self, q, k, v, lens):
        import warnings

        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from runner.ops.reference import decode_attention

        torch = self.torch
        warnings.filterwarnings("ignore", message=".*same num_heads.*")
        qq = q[:, :, None, :]
        kk, vv = k.transpose(1, 2), v.transpose(1, 2)
        arms = {}
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def f(be=be):
                with sdpa_kernel([be]):
                    return F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)
            try:
                f()
                torch.cuda.synchronize()
                arms[name] = f
            except Exception as e:  # noqa: BLE001
                arms[name] = None
                print(f"    sdpa {name}: n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
        arms["masked"] = lambda: decode_attention(q, k, v, lens)
        return {n: (None if f is None else self.rt.prepare_torch(f, mode="graph")) for n, f in arms.items()}

    def read_bandwidth(self) -> None:
        """The device's read-only bandwidth: 1 GiB read once with 16-byte non-caching loads
        (a kernel of NVRTC's, grid-stride, 4 loads in flight a thread), the best geometry's
        median, graph replay, L2 flushed before each call."""
        import tempfile

        from cuda.core import Program, ProgramOptions

        torch = self.torch
        src = r'''
extern "C" __global__ void readk(const uint4* __restrict__ x, long long n, unsigned* out) {
  unsigned acc = 0;
  const long long step = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * step < n; i += 4 * step) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(x + i + u * step));
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += step) { uint4 w = x[i]; acc ^= w.x ^ w.y ^ w.z ^ w.w; }
  if (acc == 0x9e3779b9u) out[0] = acc;
}
'''
        cubin = Program(src, code_type="c++", options=ProgramOptions(arch="sm_90")).compile("cubin")
        path = Path(tempfile.mkdtemp()) / "readk.cubin"
        path.write_bytes(bytes(cubin.code))
        n = 1 << 30
        x = torch.randint(0, 1 << 30, (n // 4,), device="cuda", dtype=torch.int32)
        out = torch.zeros(1, device="cuda", dtype=torch.int32)
        fn = self.rt.load(str(path), "readk", ["ptr", "i64", "ptr"])
        best = None
        for per_sm in (2, 4, 8, 16):
            for threads in (256, 512, 1024):
                if per_sm * threads > 2048:
                    continue
                call = self.rt.prepare(fn, [x.data_ptr(), n // 16, out.data_ptr()],
                                       {"grid": [132 * per_sm], "block": [threads], "shared_mem": 0}, mode="graph")
                t = self.time(call, reps=30)
                print(f"  read 1 GiB, {per_sm} blocks an SM of {threads}: {n / t / 1e12:.3f} TB/s", flush=True)
                best = max(best or 0, n / t / 1e12)
        c = torch.empty_like(x)
        t = self.time(self.rt.prepare_torch(lambda: c.copy_(x), mode="graph"))
        print(f"read-only bandwidth {best:.3f} TB/s; device copy of 1 GiB {2 * n / t / 1e12:.3f} TB/s (read + write)",
              flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=str(SPEC))
    ap.add_argument("--all", action="store_true", help="every configuration (default: a sample)")
    ap.add_argument("--sample", type=int, default=24)
    ap.add_argument("--only", action="append", default=[], metavar="NAME=V1,V2")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--verify-all", action="store_true", help="verify every configuration (default: the sample)")
    a = ap.parse_args()

    import torch

    p = Probe(Path(a.spec))
    cfgs = list(p.spec.space)
    for o in a.only:
        k, vs = o.split("=")
        cfgs = [c for c in cfgs if str(c[k]) in vs.split(",")]
    rng = random.Random(0)
    start = dict(p.spec.start)
    timed = cfgs if a.all else ([start] + rng.sample([c for c in cfgs if c != start], min(a.sample - 1, len(cfgs) - 1)))
    t0 = time.time()
    srcs = [p.b.render_all(c, shapes=[{"B": 1, "L": 1024}])[0] for c in timed]
    uniq = list(dict.fromkeys(srcs))
    comp = dict(zip(uniq, p.b._compile_all(uniq)))
    keep = []
    for cfg, s in zip(timed, srcs):
        c = comp[s]
        if not c.ok:
            fail(f"{label(cfg)}: {c.status}: {str(c.reason)[:300]}")
        else:
            keep.append((cfg, c.artifact, c.resources))
    print(f"{len(keep)} of {len(timed)} configurations compiled in {time.time() - t0:.0f} s "
          f"(of {len(cfgs)} in the space)", flush=True)

    # 1. verify
    t0 = time.time()
    seed = 1
    nver = 0
    vcfgs = keep if (a.verify_all or not a.all) else keep[:a.sample]
    for cfg, art, res in vcfgs:
        bad = 0
        for B, L in VERIFY:
            if not p.served(cfg, {"B": B, "L": L}):
                continue
            seed += 1
            try:
                why = p.verify(cfg, art, B, L, seed)
            except Exception as e:  # noqa: BLE001 - a fault spoils the context
                fail(f"{label(cfg)} B={B} L={L}: launch failed: {type(e).__name__}: {e}")
                return 1
            nver += 1
            if why:
                bad += 1
                fail(f"{label(cfg)} B={B} L={L}: {why}")
        why = p.deterministic(cfg, art, seed) if p.served(cfg, {"B": 6, "L": 9000}) else None
        if why:
            fail(f"{label(cfg)}: not deterministic: {why}")
        print(f"  verified {label(cfg)}: regs {res.get('registers')} {'ok' if not bad and not why else 'FAILED'}",
              flush=True)
    print(f"{nver} launches verified in {time.time() - t0:.0f} s", flush=True)
    if a.no_timing or FAILURES:
        print(f"\n{len(FAILURES)} failures")
        return 1 if FAILURES else 0

    # 3. speed
    p.read_bandwidth()
    print(f"\n{'B':>3} {'L':>7} {'MB':>7}  arms TB/s (us) ... then the best configurations")
    for B, L in POINTS:
        shape = {"B": B, "L": L}
        q, k, v, lens = p.inputs(B, L, 7, ragged=False)
        byts = 4096 * B * L
        arms = p.sdpa_arms(q, k, v, lens)
        line = []
        for name, f in arms.items():
            if f is None:
                line.append(f"{name} n/a")
                continue
            t = p.time(f)
            line.append(f"{name} {byts / t / 1e12:.2f} ({t * 1e6:.1f})")
        print(f"{B:>3} {L:>7} {byts / 1e6:>7.1f}  " + "  ".join(line), flush=True)
        rows = []
        out = torch.empty(B, 32, 128, device="cuda").bfloat16()
        for cfg, art, _ in keep:
            if not p.served(cfg, shape):
                continue
            ws = torch.zeros(B, 8, p.ws_row(shape, cfg), device="cuda")
            call = p.prepare(cfg, art, shape, q, k, v, lens, out, ws, mode="graph")
            t = p.time(call)
            rows.append((t, cfg))
        rows.sort(key=lambda r: r[0])
        for t, cfg in rows[:5]:
            print(f"          {byts / t / 1e12:5.2f} TB/s {t * 1e6:8.1f} us  {label(cfg)}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    print(f"\n{len(FAILURES)} failures")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
