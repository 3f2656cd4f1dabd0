"""Facts about torch's own kernels on the GPU that pipe's fallbacks and arms rest on (no pipe
kernel runs here). Two questions, each answered by measurement:

    python tools/baseline_probe.py attn    # decode attention: which SDPA backend takes a mask
    python tools/baseline_probe.py moe     # MoE experts: the loop and torch._grouped_mm
    python tools/baseline_probe.py         # both

attn: for GQA decode (32/8 heads, head dim 128, bf16), whether each SDPA backend runs with a
boolean [B, 1, 1, L] mask built from per-sequence lengths (what a fallback needs to be exact for
ragged lengths), whether its output matches float64 at ragged lengths, and its time as a CUDA
graph replay (L2 flushed, median of 30) beside the same backend without a mask.

moe: the expert GEMM of the gate and up projections (x [R, H] sorted by expert, w [E, N, H],
offsets int32 [E], cumulative ends) by a loop over experts and by torch._grouped_mm with w
transposed as a view (column-major B), their agreement with float64, and their times.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F


def _flush_buf():
    return torch.empty(2 * 60 * 2**20 // 4, dtype=torch.float32, device="cuda")


def graph_time(fn, reps: int = 30) -> float:
    """Median µs of a CUDA graph replay of fn, L2 flushed (read) before each replay."""
    flush = _flush_buf()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ts = []
    for _ in range(reps + 3):
        flush.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100000)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts[3:])


def direct_time(fn, reps: int = 20) -> float:
    flush = _flush_buf()
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        flush.sum()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100000)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def attn() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    HQ, HKV, D = 32, 8, 128
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    print("== decode attention: SDPA backends with a boolean length mask (enable_gqa)")
    for B, L in [(1, 1024), (1, 8192), (1, 32768), (8, 8192), (4, 4096), (16, 32768), (64, 1024), (10, 139)]:
        g = torch.Generator(device="cuda").manual_seed(B * 100003 + L)
        q = torch.randn(B, HQ, D, device="cuda", generator=g).bfloat16()
        k = torch.randn(B, L, HKV, D, device="cuda", generator=g).bfloat16()
        v = torch.randn(B, L, HKV, D, device="cuda", generator=g).bfloat16()
        lens = torch.randint(1, L + 1, (B,), device="cuda", generator=g, dtype=torch.int32)
        full = torch.full((B,), L, device="cuda", dtype=torch.int32)
        nbytes = 2 * 2 * B * L * HKV * D

        def ref(ln):
            keep = torch.arange(L, device="cuda")[None, :] < ln[:, None]
            s = torch.einsum("bhgd,blhd->bhgl", q.double().view(B, HKV, HQ // HKV, D), k.double()) / D ** 0.5
            s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
            return torch.einsum("bhgl,blhd->bhgd", torch.softmax(s, -1), v.double()).reshape(B, HQ, D)

        want_r, want_f = ref(lens), ref(full)
        row = [f"B={B:3d} L={L:6d}"]
        for name, be in backends.items():
            for masked in (False, True):
                ln = lens if masked else full

                def call(ln=ln, masked=masked, be=be):
                    mask = None
                    if masked:
                        mask = (torch.arange(L, device="cuda")[None, :] < ln[:, None])[:, None, None, :]
                    with sdpa_kernel([be]):
                        o = F.scaled_dot_product_attention(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2),
                                                           attn_mask=mask, enable_gqa=True)
                    return o[:, :, 0, :]
                tag = f"{name}{'+mask' if masked else ''}"
                try:
                    out = call()
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 - a backend that cannot run the call: the finding
                    row.append(f"{tag}: n/a ({type(e).__name__}: {str(e).splitlines()[0][:60]})")
                    continue
                want = want_r if masked else want_f
                err = (out.double() - want).abs().max().item()
                scale = want.abs().mean().item()
                try:
                    t = graph_time(call)
                    row.append(f"{tag}: {t:8.2f} us {nbytes / t / 1e6:5.2f} TB/s err/mean {err / scale:.1e}")
                except Exception as e:  # noqa: BLE001
                    row.append(f"{tag}: runs, not capturable ({type(e).__name__}) err/mean {err / scale:.1e}")
        print("\n  ".join(row), flush=True)


def moe() -> None:
    print("== MoE experts (gate+up): loop over experts and torch._grouped_mm, bf16")
    for E, topk, H, N in [(64, 6, 2048, 2816), (8, 2, 4096, 28672)]:
        w = (torch.randn(E, N, H, device="cuda") / H ** 0.5).bfloat16()
        for T in [1, 16, 128, 1024, 4096]:
            g = torch.Generator(device="cuda").manual_seed(T)
            R = T * topk
            choice = torch.stack([torch.randperm(E, device="cuda", generator=g)[:topk] for _ in range(T)]).view(-1)
            counts = torch.bincount(choice, minlength=E)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            x = torch.randn(R, H, device="cuda", generator=g).bfloat16()
            cpu_offs = [0] + offs.tolist()

            def loop():
                out = torch.empty(R, N, device="cuda", dtype=torch.bfloat16)
                for e in range(E):
                    a, b = cpu_offs[e], cpu_offs[e + 1]
                    if b > a:
                        torch.mm(x[a:b], w[e].t(), out=out[a:b])
                return out

            def grouped():
                return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)

            want = torch.empty(R, N, dtype=torch.float64, device="cuda")
            for e in range(E):
                a, b = cpu_offs[e], cpu_offs[e + 1]
                want[a:b] = x[a:b].double() @ w[e].double().t()
            active = int((counts > 0).sum())
            wbytes = active * N * H * 2
            flops = 2 * R * N * H
            row = [f"E={E} H={H} N={N} T={T:5d} R={R:6d} active={active}"]
            for name, fn in [("loop", loop), ("grouped_mm", grouped)]:
                try:
                    out = fn()
                    torch.cuda.synchronize()
                    err = ((out.double() - want).abs() / (want.abs() + 1e-2)).max().item()
                    t = direct_time(fn)
                    row.append(f"{name}: {t:9.1f} us {wbytes / t / 1e6:5.2f} TB/s(w) {flops / t / 1e6:6.1f} TFLOP/s relerr {err:.1e}")
                except Exception as e:  # noqa: BLE001
                    row.append(f"{name}: n/a ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
            print("\n  ".join(row), flush=True)


if __name__ == "__main__":
    what = sys.argv[1:] or ["attn", "moe"]
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for w_ in what:
        {"attn": attn, "moe": moe}[w_]()
