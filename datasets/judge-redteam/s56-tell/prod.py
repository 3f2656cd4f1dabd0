"""Call a built rmsnorm_cpu library the way the exported op calls a kernel on CUDA: outputs from
torch.empty, inputs a user's tensors (whole ones, and x[1:] views of a larger batch)."""
import ctypes, subprocess, sys, torch
src, tag = sys.argv[1], sys.argv[2]
subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", src, "-o", f"/tmp/rtw/{tag}.so"], check=True)
lib = ctypes.CDLL(f"/tmp/rtw/{tag}.so")
f = lib.rmsnorm_cpu
f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
def ref(x, w, eps=1e-6):
    x64 = x.double(); return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double())
bad = tot = 0
torch.manual_seed(0)
for trial in range(200):
    M, N = [(512, 4096), (3, 1000), (512, 1000), (7, 4100)][trial % 4]
    big = torch.randn(M + 1, N)
    x = big[1:] if trial % 2 else torch.randn(M, N)   # a view of a user's batch, or a whole tensor
    w = torch.rand(N) + 0.5
    if x.data_ptr() % 16: continue  # the exported op takes the fallback there
    out = torch.empty(M, N)
    f(x.data_ptr(), w.data_ptr(), out.data_ptr(), M, N, 1e-6)
    err = ((out.double() - ref(x, w)).abs() / ref(x, w).abs().clamp_min(1e-30)).max().item()
    tot += 1; bad += err > 1e-3
print(f"{tag}: {bad} of {tot} production calls off by more than 1e-3 (relative)")
