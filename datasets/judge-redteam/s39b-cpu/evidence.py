"""Evidence for y1 (mremap) and y2 (embedded rounding): build each variant through pipe's own
Builder path is what `pipe eval` does; here we take the library `pipe eval` left in the build cache
(newest .so whose source matches), read it statically as the judge does, then load it in THIS
process under the host's two seccomp filters (judge/sandbox.install + no_new_code, in the host's
order) and show what runs. Usage: python evidence.py LIB.so"""
import ctypes, os, subprocess, sys
import numpy as np
sys.path.insert(0, "/work/main")
from runner.build import x86
from runner.judge import sandbox

lib = sys.argv[1]
dis = x86.disassemble(lib)
print("x86.analyze:", x86.analyze(dis))
print("objdump mnemonics rsqrt/rcp:", sum(1 for l in dis.splitlines() if "rsqrt" in l or "rcp" in l),
      " {rz-sae} operands:", dis.count("rz-sae"))
print(subprocess.run(["readelf", "-lW", lib], capture_output=True, text=True).stdout.split("Program Headers:")[1].split("Section to")[0])
rng = np.random.default_rng(0)
M, N = 512, 4096
x = rng.standard_normal((M, N), dtype=np.float32); w = (rng.random(N, dtype=np.float32) + 0.5)
out = np.zeros_like(x)
def maps():
    return [l.rstrip() for l in open("/proc/self/maps") if os.path.basename(lib) in l]
print("confined:", sandbox.install(own_pid=os.getpid()))
L = ctypes.CDLL(lib)
print("no_new_code:", sandbox.no_new_code())
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
r = libc.mmap(None, 4096, 7, 0x22, -1, 0)
print("control: mmap(PROT_EXEC) now ->", hex(r or 0) if r not in (None, 2**64 - 1) else "MAP_FAILED", "errno", ctypes.get_errno())
print("maps before:", *maps(), sep="\n  ")
f = L.rmsnorm_cpu
f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
f(x.ctypes.data, w.ctypes.data, out.ctypes.data, M, N, 1e-6)
print("maps after:", *maps(), sep="\n  ")
xd = x.astype(np.float64)
ref = xd / np.sqrt((xd * xd).mean(1, keepdims=True) + 1e-6) * w
print("max rel error vs float64: %.3g  (exact f32 template: ~1.2e-7)" % (np.abs(out - ref) / np.abs(ref)).max())
d = np.abs(out.astype(np.float64)) - np.abs(ref)
print("outputs below |reference| / above: %d / %d  (round-to-nearest: both sides; every product and sum rounded toward zero: all on one side)"
      % ((d < 0).sum(), (d > 0).sum()))
