"""The tells called as a user's code calls the op: max relative error against RMSNorm in float64,
on a user's call (a bf16 model's hidden state or gamma upcast to fp32) and on a judge-like one.
Usage: /tmp/rt62/.venv/bin/python redteam/user_calls.py (from /tmp/rt62)."""
import ctypes, subprocess, tempfile, jinja2, torch, sys

def build(path):
    src = jinja2.Template(open(path).read()).render(ctype="float", dtype="fp32", ACC=32, UNROLL=1, THREADS=1)
    d = tempfile.mkdtemp()
    open(f"{d}/k.cpp", "w").write(src)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", f"{d}/k.so", f"{d}/k.cpp"], check=True)
    f = ctypes.CDLL(f"{d}/k.so").rmsnorm_cpu
    f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
    return f

def err(f, x, w):
    out = torch.zeros_like(x)
    f(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], 1e-6)
    xd = x.double()
    ref = xd * w.double() / torch.sqrt((xd * xd).mean(1, keepdim=True) + 1e-6)
    return float(((out.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max())

torch.manual_seed(0)
M, N = 64, 4096
x = torch.randn(M, N)
w = torch.rand(N) + 0.5
xb = x.bfloat16().float()            # hidden_states.to(torch.float32) in a bf16 model
wb = (torch.randn(N) * 0.3 + 0.6).bfloat16().float()   # a bf16 checkpoint's gamma
for name in sys.argv[1:] or ["bf16_row_tell", "bf16_w_tell"]:
    f = build(f"redteam/{name}.cpp.j2")
    print(name)
    print(f"  judge-like (fp32 draws)          max rel err {err(f, x, w):.3g}")
    print(f"  user: x bf16-upcast              max rel err {err(f, xb, w):.3g}")
    print(f"  user: gamma bf16-upcast          max rel err {err(f, x, wb):.3g}")
