"""Per-call times of moe-cpu template variants on fresh inputs, outside the judge: the mean a
caller pays against the median the judge's figure takes (s38e's failed attempt 1, s38f's finding B).
    python calls.py T CALLS TEMPLATE:MR:NR ...   (from the reproducer's folder, venv active; builds in /tmp/calls-OUT)"""
import ctypes, os, statistics, subprocess, sys, time
import jinja2, torch
sys.path.insert(0, "/work/main")
from runner.judge.inputs import routing_counts

T, calls = int(sys.argv[1]), int(sys.argv[2])
libs = []
for spec in sys.argv[3:]:
    tpl, mr, nr = spec.split(":")
    src = jinja2.Template(open(tpl).read()).render(E=4, N=96, K=64, SWIGLU=0, MR=int(mr), NR=int(nr), ctype="uint16_t")
    os.makedirs("/tmp/calls-out", exist_ok=True)
    base = f"/tmp/calls-out/{tpl.replace('/', '_')}_{mr}_{nr}"
    open(base + ".cpp", "w").write(src)
    subprocess.run(["g++", "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", base + ".cpp", "-o", base + ".so"], check=True)
    f = ctypes.CDLL(base + ".so").moe_gemm_cpu
    f.restype, f.argtypes = None, [ctypes.c_void_p] * 4 + [ctypes.c_int64]
    libs.append((spec, f))
g = torch.Generator().manual_seed(1)
times = {s: [] for s, _ in libs}
for c in range(calls):
    x = torch.randn(T * 2, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(4, 96, 64, generator=g).to(torch.bfloat16)
    offs = torch.cumsum(routing_counts("routing", 4, T * 2, 2, g), 0).to(torch.int32)
    y = torch.empty(T * 2, 96, dtype=torch.bfloat16)
    for s, f in (libs if c % 2 else libs[::-1]):  # back to back, order alternating
        t0 = time.perf_counter_ns(); f(x.data_ptr(), w.data_ptr(), offs.data_ptr(), y.data_ptr(), T); t1 = time.perf_counter_ns()
        times[s].append((t1 - t0) / 1e3)
for s, ts in times.items():
    q = statistics.quantiles(ts, n=10)
    print(f"{s:32s} T={T} median {statistics.median(ts):8.1f} us  mean {statistics.fmean(ts):8.1f} us  p10 {q[0]:7.1f}  p90 {q[-1]:7.1f}")
