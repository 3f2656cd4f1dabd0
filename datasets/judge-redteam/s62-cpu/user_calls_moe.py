"""moe_topk_twin_tell called as a real MoE layer calls its grouped GEMM (each token's row gathered
once per chosen expert) and as the judge's value sets look (independent rows). Max relative error
against a float64 grouped GEMM. Usage: /tmp/rt62/.venv/bin/python redteam/user_calls_moe.py"""
import ctypes, subprocess, tempfile, jinja2, torch
E, N, K, TOPK = 4, 96, 64, 2

def build(path):
    src = jinja2.Template(open(path).read()).render(ctype="uint16_t", dtype="bf16", E=4, N=96, K=64, SWIGLU=0, MR=1, NR=4)
    d = tempfile.mkdtemp()
    open(f"{d}/k.cpp", "w").write(src)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", f"{d}/k.so", f"{d}/k.cpp"], check=True)
    f = ctypes.CDLL(f"{d}/k.so").moe_gemm_cpu
    f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64]
    return f

def err(f, x, w, counts):
    offs = torch.cumsum(counts, 0).to(torch.int32)
    y = torch.zeros(x.shape[0], N, dtype=torch.bfloat16)
    f(x.data_ptr(), w.data_ptr(), offs.data_ptr(), y.data_ptr(), x.shape[0] // TOPK)
    ref = torch.cat([x[s:e].double() @ w[i].double().T for i, (s, e) in
                     enumerate(zip([0] + offs[:-1].tolist(), offs.tolist()))])
    return float(((y.double() - ref).abs() / ref.abs().clamp_min(1e-3)).median())

torch.manual_seed(0)
w = torch.randn(E, N, K).bfloat16()
for T in (4, 16, 64):
    tokens = torch.randn(T, K).bfloat16()
    choice = torch.stack([torch.randperm(E)[:TOPK] for _ in range(T)])      # a router's top-2
    order = torch.argsort(choice.reshape(-1), stable=True)                     # rows sorted by expert
    x_user = tokens.repeat_interleave(TOPK, 0)[order].contiguous()
    counts = torch.bincount(choice.reshape(-1), minlength=E)
    x_judge = torch.randn(T * TOPK, K).bfloat16()
    for name in ("honest", "moe_topk_twin_tell"):
        f = build("/tmp/rt62/kernel_templates/moe_gemm.cpp.j2" if name == "honest" else f"redteam/{name}.cpp.j2")
        print(f"T={T:3d} {name:20s} user call median rel err {err(f, x_user, w, counts):.3g}   "
              f"judge-like {err(f, x_judge, w, counts):.3g}")
