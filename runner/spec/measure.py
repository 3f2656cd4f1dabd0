"""pipe hw: measure the GPU it runs on, for a hardware profile's measured figures.

A profile's ceilings decide the judge's physical floor (bytes over bandwidth, operations over
rate) and every roofline figure a report draws; a profile that only estimates them (the
datasheet less 10%) rejects an honest kernel as impossible, or lets a figure stand that is not,
by that error. Three figures, each the median of timed calls with its quartiles, after warm-up,
on random data, with the L2 out of the way by size (every buffer is many times the L2):

- the copy bandwidth: torch's device copy of 2 GiB into 2 GiB, bytes read plus written
  (`bandwidth.measured_bytes_per_s`);
- the read-only bandwidth: 1 GiB read once with 16-byte non-caching loads by a kernel of the
  runtime's compiler, the best of six launch geometries (`bandwidth.read_bytes_per_s`, which an
  op with `op.traffic: read` is held to);
- the dense bf16 tensor-core rate: torch.matmul of two 8192 x 8192 bf16 matrices, cuBLAS
  (`peak_flops.bf16`).

The figures come with the profile lines to paste, and against a profile (the one named, else
the one whose device_name this GPU carries) the ratio of each.
"""
from __future__ import annotations

import datetime
import json
import statistics
import tempfile
from pathlib import Path

from ..core.errors import PipeError
from .hw import PACKAGE_ROOT, HwProfile, find_profile, load_profile

READ_KERNEL = r'''
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
READ_GEOMETRIES = [(per_sm, threads) for per_sm in (2, 4, 8, 16) for threads in (256, 512, 1024)
                   if per_sm * threads <= 2048]


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of `xs`."""
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def _times(torch, call, reps: int, warmup: int = 3) -> list[float]:
    """Seconds of each of `reps` calls by CUDA events, after `warmup` untimed ones; a device
    spin queued ahead of the start event keeps the host's launch out of the figure (a 1 GiB
    read takes some 300 us, the launch some 5)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)
        start.record()
        call()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def pick_profile(name: str | None, device_name: str) -> HwProfile | None:
    """The profile named (a name under hw_profiles/ or a path), else pipe's own CUDA profile
    whose device_name this GPU's name carries, else None."""
    if name:
        p = Path(name)
        path = p if p.suffix in (".yaml", ".yml") and p.is_file() else find_profile(name, Path.cwd())
        if path is None:
            raise PipeError(f"--profile {name}: no hw_profiles/{name}.yaml here, above here or in pipe's own, "
                            "and no such file")
        return load_profile(path)
    for path in sorted((PACKAGE_ROOT / "hw_profiles").glob("*.yaml")):
        prof = load_profile(path)
        dn = prof.get("device_name")
        if prof.kind == "cuda" and dn and dn.lower() in device_name.lower():
            return prof
    return None


def measure(reps: int = 20, profile: str | None = None) -> dict:
    """The three figures on CUDA device 0 (module docstring): {"device", "figures": {key:
    {"value", "q1", "q3", "unit", "how"}}, "profile"}. PipeError without a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise PipeError("pipe hw measures the GPU it runs on, and torch finds no CUDA GPU here")
    props = torch.cuda.get_device_properties(0)
    prof = pick_profile(profile, props.name)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    figs: dict[str, dict] = {}
    g = torch.Generator(device="cuda").manual_seed(0)

    figs["bandwidth.measured_bytes_per_s"] = _copy_bandwidth(torch, g, reps)
    x = torch.randint(-2**31, 2**31 - 1, ((1 << 30) // 4,), dtype=torch.int32, device="cuda", generator=g)
    figs["bandwidth.read_bytes_per_s"] = _read_bandwidth(torch, x, props, reps)
    del x
    m = 8192
    a = torch.randn(m, m, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(m, m, device="cuda", generator=g).to(torch.bfloat16)
    c = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
    ts = _times(torch, lambda: torch.matmul(a, b, out=c), reps)
    q1, med, q3 = quartiles([2 * m ** 3 / t for t in ts])
    figs["peak_flops.bf16"] = {"value": med, "q1": q1, "q3": q3, "unit": "FLOP/s",
                               "how": f"torch.matmul of two {m} x {m} bf16 matrices (cuBLAS), median of {reps}"}
    return {"device": {"name": props.name, "sm_count": props.multi_processor_count,
                       "l2_bytes": int(getattr(props, "L2_cache_size", 0)), "memory_bytes": int(props.total_memory),
                       "torch": torch.__version__},
            "date": datetime.date.today().isoformat(), "figures": figs,
            "profile": None if prof is None else {"name": prof.name, "path": prof.path, "data": prof.data}}


def _copy_bandwidth(torch, g, reps: int) -> dict:
    """torch's device copy of 2 GiB of random words into 2 GiB: bytes read plus written a second."""
    n = 2 << 30
    src = torch.randint(-2**31, 2**31 - 1, (n // 4,), dtype=torch.int32, device="cuda", generator=g)
    dst = torch.empty_like(src)
    q1, med, q3 = quartiles([2 * n / t for t in _times(torch, lambda: dst.copy_(src), reps)])
    return {"value": med, "q1": q1, "q3": q3, "unit": "B/s",
            "how": f"torch copy of 2 GiB into 2 GiB, bytes read plus written, median of {reps}"}


def cubin_file(src: str, arch: str, name: str = "kernel") -> str:
    """`src` compiled by NVRTC for `arch` (sm_XY) into a cubin in a fresh temporary folder: its
    path (the runtime loads kernels from files). No include path: sources that need none."""
    from cuda.core import Program, ProgramOptions

    code = Program(src, code_type="c++", options=ProgramOptions(arch=arch)).compile("cubin")
    path = Path(tempfile.mkdtemp()) / f"{name}.cubin"
    path.write_bytes(bytes(code.code))
    return str(path)


def _read_bandwidth(torch, x, props, reps: int) -> dict:
    """1 GiB (`x`) read once by READ_KERNEL at each of READ_GEOMETRIES: the best median."""
    import numpy as np
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    dev = Device(torch.cuda.current_device())
    dev.set_current()
    kernel = ObjectCode.from_cubin(cubin_file(READ_KERNEL, f"sm_{props.major}{props.minor}", "readk")
                                   ).get_kernel("readk")
    out = torch.zeros(1, device="cuda", dtype=torch.int32)
    nbytes = x.numel() * x.element_size()
    stream = dev.create_stream(torch.cuda.current_stream())

    best = None
    for per_sm, threads in READ_GEOMETRIES:
        cfg = LaunchConfig(grid=props.multi_processor_count * per_sm, block=threads)

        def call(cfg=cfg):
            launch(stream, cfg, kernel, x.data_ptr(), np.int64(nbytes // 16), out.data_ptr())

        q1, med, q3 = quartiles([nbytes / t for t in _times(torch, call, reps)])
        if best is None or med > best["value"]:
            best = {"value": med, "q1": q1, "q3": q3, "unit": "B/s",
                    "how": f"1 GiB read once with 16-byte non-caching loads, {per_sm} blocks an SM of {threads} "
                           f"threads (the best of {len(READ_GEOMETRIES)} geometries), median of {reps}"}
    return best


def _si(v: float) -> str:
    return f"{v:.3g}".replace("e+", "e")


def report(got: dict) -> str:
    """What pipe hw prints: the figures with their quartiles, each against the profile's, and
    the profile lines to paste."""
    d, figs, prof = got["device"], got["figures"], got["profile"]
    lines = [f"pipe hw on {d['name']} ({d['sm_count']} SMs, {d['l2_bytes'] / 2**20:.0f} MiB L2, "
             f"{d['memory_bytes'] / 2**30:.1f} GiB), torch {d['torch']}, {got['date']}"]
    scale = {"B/s": (1e12, "TB/s", 3), "FLOP/s": (1e12, "TFLOP/s", 1)}
    for key, f in figs.items():
        div, unit, dp = scale[f["unit"]]
        v, q1, q3 = (f[k] / div for k in ("value", "q1", "q3"))
        lines.append(f"  {key:32s} {v:.{dp}f} {unit} [{q1:.{dp}f}..{q3:.{dp}f}]: {f['how']}")
    if prof is not None:
        lines.append(f"against profile '{prof['name']}' ({prof['path']}):")
        for key, f in figs.items():
            sect, k = key.split(".")
            have = (prof["data"].get(sect) or {}).get(k)
            if have:
                lines.append(f"  {key:32s} {_si(float(have)):>9s} in the profile, measured {_si(f['value'])} "
                             f"({f['value'] / float(have):.2f}x)")
            else:
                lines.append(f"  {key:32s} {'none':>9s} in the profile, measured {_si(f['value'])}")
    else:
        lines.append("no profile in pipe's hw_profiles/ names this GPU (--profile NAME compares with one)")
    bw, rd, mm = (figs[k] for k in ("bandwidth.measured_bytes_per_s", "bandwidth.read_bytes_per_s",
                                    "peak_flops.bf16"))
    d_name, got_date, bw_how, rd_how = d["name"], got["date"], bw["how"], rd["how"]  # (quoted as YAML strings)
    lines += ["for the profile (hw_profiles/NAME.yaml):",
              "bandwidth:",
              f"  measured_bytes_per_s: {_si(bw['value'])}",
              f"  measured_by: {json.dumps(f'pipe hw on {d_name}, {got_date}: {bw_how}')}",
              f"  read_bytes_per_s: {_si(rd['value'])}",
              f"  read_measured_by: {json.dumps(f'pipe hw on {d_name}, {got_date}: {rd_how}')}",
              "peak_flops:",
              f"  bf16: {_si(mm['value'])}   # {mm['how']}"]
    return "\n".join(lines)
