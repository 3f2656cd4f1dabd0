"""The exported range ops at sizes nobody tuned on, as a user would call them (GPU).

    python tools/range_exported.py PKG_DIR

PKG_DIR holds packages written by `pipe export` from range runs (softmax_range_h200,
rmsnorm_range_h200, cross_entropy_range_h200: whichever are there). For each op and
size: the exported op's answer against torch in float64, which path it took (kernel or
fallback), and its time against torch eager and torch.compile (dynamic shapes), all
timed by `triton.testing.do_bench` (which empties the L2 before every call), printed
as TB/s of the op's bytes. These are the sizes issue 20 measured the fixed-size
packages at. Exits 1 if an answer is wrong.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

SIZES = {
    "softmax_range_h200": [(3000, 5000), (777, 12345), (65536, 128), (4096, 7168), (2048, 262144), (1, 100000),
                           (32768, 4096)],
    "rmsnorm_range_h200": [(4096, 7168), (3000, 5000), (777, 12345), (65536, 128), (1024, 262144), (32768, 4096)],
    "cross_entropy_range_h200": [(4096, 50257), (2048, 128256), (4096, 151936), (8192, 1000), (512, 262144),
                                 (4096, 32000)],
}


def case(name: str, m: int, n: int):
    g = torch.Generator(device="cuda").manual_seed(m * 7919 + n)
    x = torch.randn(m, n, device="cuda", generator=g).bfloat16()
    if name.startswith("softmax"):
        args = (x,)
        ref = torch.softmax(x.double(), -1)
        eager = lambda: torch.softmax(x, -1)  # noqa: E731
        nbytes = 4 * m * n
        tol = (1e-3, 1.6e-2)
    elif name.startswith("rmsnorm"):
        w = (torch.rand(n, device="cuda", generator=g) + 0.5).bfloat16()
        args = (x, w, 1e-6)
        ref = F.rms_norm(x.double(), (n,), w.double(), 1e-6)
        eager = lambda: F.rms_norm(x, (n,), w, 1e-6)  # noqa: E731
        nbytes = 4 * m * n + 2 * n
        tol = (1e-2, 1.6e-2)
    else:
        t = torch.randint(0, n, (m,), device="cuda", generator=g)
        t[::17] = -100
        args = (x, t, -100)
        ref = F.cross_entropy(x.double(), t, ignore_index=-100, reduction="none")
        eager = lambda: F.cross_entropy(x.float(), t, ignore_index=-100, reduction="none")  # noqa: E731
        nbytes = 2 * m * n + 12 * m
        tol = (1e-3, 2e-4)
    return args, ref, eager, nbytes, tol


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="the folder `pipe export` wrote the range packages into")
    root = Path(ap.parse_args().root)
    from triton.testing import do_bench  # (the GPU machine's: --help needs no Triton)

    sys.path.insert(0, str(root))
    bad = 0
    print(f"{'op':26} {'size':>13} {'path':>8} {'exported':>9} {'eager':>7} {'compile':>8}   (TB/s; do_bench, L2 emptied)")
    for name, sizes in SIZES.items():
        if not (root / name).is_dir():
            continue
        mod = importlib.import_module(name)
        fn = getattr(mod, [k for k in ("softmax", "rmsnorm", "cross_entropy") if name.startswith(k)][0])
        for m, n in sizes:
            args, ref, eager, nbytes, (atol, rtol) = case(name, m, n)
            before = dict(mod.op.calls)
            with torch.no_grad():
                out = fn(*args)
            path = "kernel" if mod.op.calls["kernel"] > before["kernel"] else "fallback"
            ok = torch.allclose(out.double(), ref, atol=atol, rtol=rtol, equal_nan=True)
            if not ok:
                bad += 1
                err = (out.double() - ref).abs().nan_to_num(1e9).max().item()
                print(f"WRONG {name} {m}x{n}: max error {err:.3g}")
            comp = torch.compile(eager, dynamic=True)
            comp()
            t_exp = do_bench(lambda: fn(*args), warmup=25, rep=100)
            t_eag = do_bench(eager, warmup=25, rep=100)
            t_cmp = do_bench(comp, warmup=25, rep=100)
            tbs = lambda ms: nbytes / (ms * 1e-3) / 1e12  # noqa: E731
            print(f"{name:26} {f'{m}x{n}':>13} {path:>8} {tbs(t_exp):9.2f} {tbs(t_eag):7.2f} {tbs(t_cmp):8.2f}"
                  + ("" if ok else "  WRONG"), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
