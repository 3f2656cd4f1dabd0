"""The tells of this red team called as a user's code calls the exported op. Prints the max relative
error against RMSNorm in float64 on a user's call and on a judge-like one (w drawn `positive`,
independent rows). Usage: PYTHONPATH=/tmp/rt58 python redteam/user_calls.py (from /tmp/rt58)."""
import ctypes, subprocess, tempfile, jinja2, torch

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
judge_w = torch.rand(N) + 0.5                      # `positive`
gamma = (torch.randn(N) * 0.3 + 0.6)               # a trained gamma: a spread around its mean, a few < 0.25
gamma_pos = torch.rand(N) * 0.95 + 0.05            # positive only, some small (a model's first layer)
plain = torch.randn(M, N)
base = torch.randn(1, N)
batch = base + 0.5 * torch.randn(M, N)             # rows sharing a component (cosine about 0.8)
twice = plain.clone()
twice[1::2] = plain[0::2] + 1e-3 * torch.randn(M // 2, N)  # a prompt twice, slightly different
for name, user in (("weight_tell", [("gamma N(0.6, 0.3)", plain, gamma), ("gamma in [0.05, 1)", plain, gamma_pos)]),
                   ("near_tell", [("rows sharing a component", batch, judge_w), ("near-duplicate rows", twice, judge_w)])):
    f = build(f"redteam/{name}.cpp.j2")
    print(name)
    for label, x, w in user:
        print(f"  user call, {label:28s} max rel err {err(f, x, w):.3g}")
    print(f"  judge-like call (iid rows, w positive) max rel err {err(f, plain, judge_w):.3g}")
