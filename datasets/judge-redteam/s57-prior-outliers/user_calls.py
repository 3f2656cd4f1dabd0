"""Each tell kernel called as a user's code calls the exported op: a fresh output (torch.zeros stands
for fresh pages), and hidden states with outlier channels. Prints the max relative error against
rmsnorm in float64, and, as a control, the same on the judge-like calls (decoy-filled output,
no outlier channels). Usage: python user_calls.py (from /tmp/rt57)."""
import ctypes, subprocess, tempfile, jinja2, torch

def build(name):
    src = jinja2.Template(open(f"tests/data/{name}.cpp.j2").read()).render(ctype="float", dtype="fp32", ACC=32,
                                                                           UNROLL=1, THREADS=1)
    d = tempfile.mkdtemp()
    open(f"{d}/k.cpp", "w").write(src)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", f"{d}/k.so", f"{d}/k.cpp"], check=True)
    f = ctypes.CDLL(f"{d}/k.so").rmsnorm_cpu
    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
    return f

def err(f, x, w, out):
    f(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], 1e-6)
    xd = x.double()
    ref = xd * w.double() / torch.sqrt((xd * xd).mean(1, keepdim=True) + 1e-6)
    return float(((out.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max())

torch.manual_seed(0)
M, N = 64, 4096
w = torch.rand(N) + 0.5
plain = torch.randn(M, N)
hidden = plain.clone()
cols = torch.randperm(N)[:4]
hidden[:, cols] = 60 * (hidden[:, cols].abs() + 1)  # outlier channels: large, one sign, every row
decoy = torch.randn(M, N).abs() * 0.3
for name in ("zero_tell", "outlier_tell"):
    f = build(name)
    print(name)
    print("  user call, fresh output (zeros), plain rows:   max rel err %.3g" % err(f, plain, w, torch.zeros(M, N)))
    print("  user call, stale output, hidden states:        max rel err %.3g" % err(f, hidden, w, decoy.clone()))
    print("  judge-like call, decoy in output, plain rows:  max rel err %.3g" % err(f, plain, w, decoy.clone()))
