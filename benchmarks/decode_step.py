"""A decode step of a small Llama-style model with pipe's exported ops, in a CUDA graph.

B sequences, one new token each, bf16. Per layer: RMSNorm, the fused QKV projection (32 query
heads over 8 KV heads, head dim 128: hidden 4096), the new token's K and V written into each
layer's contiguous KV cache [B, LMAX, 8, 128] (the exported op's layout, docs/attention.md) at
position lens[b] - 1 (index_put_ with device indices: no host sync, so the graph replays at
new lengths), GQA decode attention over each sequence's first lens[b] tokens, the O projection
and the residual, RMSNorm, the SwiGLU MLP and the residual. Then the final RMSNorm, the LM head
and the softmax over the vocabulary (the sampling probabilities). The default shapes are
Mistral 7B's (hidden 4096, 32/8 heads, FFN 14336, vocabulary 32768) with 2 layers; no rotary
embedding (elementwise, the same in every arm). Arms, each captured into a CUDA graph and timed
by replaying it:

- torch: stock torch; the attention is F.scaled_dot_product_attention with a boolean
  [B, 1, 1, LMAX] length mask and enable_gqa=True, pinned to cuDNN (--sdpa): on torch 2.11 the
  flash and efficient backends refuse a mask with GQA and the math one is some 40x slower at
  B 8, L 8192 (notebook/kernels.md, "What an exact fallback costs");
- torch.compile: the same step compiled by inductor (dynamic=False), captured after warm-up;
- pipe: the exported decode-attention, RMSNorm and softmax ops in place of torch's (the
  matmuls and the rest unchanged); pipe+compile: that step compiled (the exported ops stay
  opaque custom ops).

Between timed replays the lengths tensor is refreshed in place (new ragged lengths, the same
longest one), so an arm that kept stale results would be caught: the outputs (the hidden state
after the last layer and the probabilities) are compared at two draws of the lengths with the
same step in float32 (exact attention, the same bf16 weights and caches), and an arm may be at
most twice as far from it as the torch arm is (or a floor of bf16 rounding); a wrong arm gets no
speedup. Usage (after `pipe export` of the three runs into
DIR):

    python benchmarks/decode_step.py --exported DIR [--batch 8 --context 8192 --layers 2]
        [--names decode_attention_h200,rmsnorm_h200,softmax_h200]   (the default; or the range packages)

On a machine without CUDA it runs the arms eagerly on the CPU with small defaults (no graphs,
no timing claims; the exported ops fall back to torch there): a check of the wiring.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graphs import arm_time, captured, fold_rounds  # noqa: E402

# the RMSNorm specs' eps: an exported op runs its kernels at the scalar values they were
# verified at and takes the fallback at any other (a model with eps 1e-5 writes that in its spec)
EPS = 1e-6
# the exported packages, in the order attention, RMSNorm, softmax: `pipe export` names a package
# after its spec (pipelines/decode-attention-h200.yaml -> decode_attention_h200). The flagship
# RMSNorm and softmax (their runs kept in tests/data) have kernels at the default shapes' row
# lengths, 4096 and 32768, for any number of rows; the range specs' (rmsnorm_range_h200,
# softmax_range_h200) serve any row length and tune a level of few rows, as a decode step has
NAMES = ("decode_attention_h200", "rmsnorm_h200", "softmax_h200")
FUNCS = ("decode_attention", "rmsnorm", "softmax")  # each package's function (its reference's name)
ARMS = ("torch", "torch.compile", "pipe", "pipe+compile")


def sdpa_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Stock torch's exact ragged GQA decode attention, as runner.ops.reference:decode_attention's
    bf16 path: q [B, HQ, D], k and v [B, L, HKV, D], sequence b attends to its first lens[b]
    tokens through a boolean [B, 1, 1, L] mask built on the device."""
    L = k.shape[1]
    keep = torch.arange(L, device=q.device)[None, :] < lens[:, None]
    o = F.scaled_dot_product_attention(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=keep[:, None, None, :], enable_gqa=True)
    return o[:, :, 0, :]


class Ops:
    """decode_attention, rmsnorm and softmax: torch's, or the exported packages'."""

    def __init__(self, exported: Path | None = None, names=NAMES):
        self.pkgs = []
        if exported is None:
            self.decode_attention = sdpa_decode
            self.rmsnorm = lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps)
            self.softmax = lambda x: torch.softmax(x, dim=-1)
            return
        missing = [n for n in names if not (exported / n / "__init__.py").is_file()]
        if missing:
            raise SystemExit(f"decode_step: {exported} lacks the exported package(s) {', '.join(missing)}: "
                             f"make them with `pipe export RUN --out {exported}` for the decode-attention, "
                             f"RMSNorm and softmax runs (--names: the packages, in that order)")
        sys.path.insert(0, str(exported))
        self.pkgs = [importlib.import_module(n) for n in names]
        for pkg, fn in zip(self.pkgs, FUNCS):
            if not callable(getattr(pkg, fn, None)):
                raise SystemExit(f"decode_step: the package {pkg.__name__} has no {fn}(): --names takes the "
                                 f"decode-attention, RMSNorm and softmax packages, in that order")
            setattr(self, fn, getattr(pkg, fn))

    def calls(self) -> dict:
        return {p.__name__: dict(p.op.calls) for p in self.pkgs}

    def preload(self) -> None:
        for p in self.pkgs:
            p.op.preload()


def make_weights(cfg: dict, device: str, seed: int = 0) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    hidden, ffn, vocab = cfg["hidden"], cfg["ffn"], cfg["vocab"]
    qkv = (cfg["heads"] + 2 * cfg["kv_heads"]) * cfg["head_dim"]

    def w(*shape, scale):
        return (torch.randn(*shape, generator=g, device=device) * scale).bfloat16()

    def norm():
        return (torch.rand(hidden, generator=g, device=device) + 0.5).bfloat16()

    layers = [{"n1": norm(), "n2": norm(), "qkv": w(hidden, qkv, scale=hidden ** -0.5),
               "o": w(hidden, hidden, scale=hidden ** -0.5), "w1": w(hidden, ffn, scale=hidden ** -0.5),
               "w3": w(hidden, ffn, scale=hidden ** -0.5), "w2": w(ffn, hidden, scale=ffn ** -0.5)}
              for _ in range(cfg["layers"])]
    # the LM head scaled up so that the probabilities are peaked, as a trained model's are
    return {"layers": layers, "nf": norm(), "lm": w(hidden, vocab, scale=4 * hidden ** -0.5)}


def step(ops: Ops, W: dict, cfg: dict, x: torch.Tensor, lens: torch.Tensor, kc: list, vc: list):
    """One decode step: x [B, hidden] the new tokens' embeddings, lens [B] int32 each sequence's
    length with its new token, kc and vc each layer's cache [B, LMAX, HKV, D] (written in place).
    Returns the hidden state after the last layer and the probabilities [B, vocab]."""
    B = x.shape[0]
    hq, hkv, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    rows = torch.arange(B, device=x.device)
    pos = lens.long() - 1  # the new token's place: device indices, no host sync
    for i, lw in enumerate(W["layers"]):
        h = ops.rmsnorm(x, lw["n1"], EPS)
        qkv = h @ lw["qkv"]
        q = qkv[:, :hq * d].reshape(B, hq, d).contiguous()  # the exported op takes contiguous tensors
        k = qkv[:, hq * d:(hq + hkv) * d].reshape(B, hkv, d)
        v = qkv[:, (hq + hkv) * d:].reshape(B, hkv, d)
        kc[i].index_put_((rows, pos), k)
        vc[i].index_put_((rows, pos), v)
        a = ops.decode_attention(q, kc[i], vc[i], lens)
        x = x + a.reshape(B, hq * d) @ lw["o"]
        h = ops.rmsnorm(x, lw["n2"], EPS)
        x = x + (F.silu(h @ lw["w1"]) * (h @ lw["w3"])) @ lw["w2"]
    probs = ops.softmax(ops.rmsnorm(x, W["nf"], EPS) @ W["lm"])
    return x, probs


def draw_lens(n: int, batch: int, context: int, seed: int = 1) -> torch.Tensor:
    """n draws of ragged lengths in [1, context], each with one sequence at context (the same
    longest length, so every draw is as much work at most); with one sequence, any length."""
    g = torch.Generator().manual_seed(seed)
    out = torch.randint(1, context + 1, (n, batch), generator=g, dtype=torch.int32)
    if batch > 1:
        out[torch.arange(n), torch.arange(n) % batch] = context
    return out



def time_graph(g, lens: torch.Tensor, draws: torch.Tensor, start: int, reps: int) -> list[float]:
    """reps replays, each after the lengths were refreshed in place (outside the events)."""
    times = []
    for i in range(reps):
        lens.copy_(draws[(start + i) % len(draws)])
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def pin_sdpa(choice: str, device: str) -> str:
    """The torch arm's SDPA backend (global: inductor picks the backend when it traces)."""
    if device != "cuda" or choice == "default":
        return "default" if device == "cuda" else "default (cpu)"
    b = torch.backends.cuda
    b.enable_flash_sdp(choice == "flash")
    b.enable_mem_efficient_sdp(choice == "efficient")
    b.enable_math_sdp(choice == "math")
    b.enable_cudnn_sdp(choice == "cudnn")
    return choice


def make_arms(stock: Ops, pipe: Ops | None, W: dict, cfg: dict, want) -> dict:
    """name -> the step function of each arm asked for (the pipe ones only with a pipe Ops)."""
    def eager(ops):
        return lambda *a: step(ops, W, cfg, *a)

    arms = {"torch": eager(stock), "torch.compile": torch.compile(eager(stock), dynamic=False)}
    if pipe is not None:
        arms["pipe"] = eager(pipe)
        arms["pipe+compile"] = torch.compile(eager(pipe), dynamic=False)
    return {n: f for n, f in arms.items() if n in want or n == "torch"}


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """The ragged GQA decode attention in the inputs' dtype (float32 for the reference step),
    written out: query head h reads KV head h // (HQ / HKV), sequence b its first lens[b] tokens."""
    B, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(B, hkv, hq // hkv, d)
    s = torch.einsum("bkgd,blkd->bkgl", qg, k) * d ** -0.5
    keep = torch.arange(k.shape[1], device=q.device)[None, :] < lens[:, None]
    p = torch.softmax(s.masked_fill(~keep[:, None, None, :], float("-inf")), dim=-1)
    return torch.einsum("bkgl,blkd->bkgd", p, v).reshape(B, hq, d)


def exact_ops() -> "Ops":
    """The reference step's ops: every one in float32 (its inputs' dtype), the attention exact."""
    ops = Ops()
    ops.decode_attention = exact_attention
    return ops


def in_f32(W: dict) -> dict:
    """The weights as float32: bf16 values are exact in it, so the reference step computes the same
    model, rounding only to float32."""
    return {"layers": [{k: t.float() for k, t in lw.items()} for lw in W["layers"]],
            "nf": W["nf"].float(), "lm": W["lm"].float()}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def run(exported: Path | None, names, cfg: dict, reps: int, rounds: int, device: str, sdpa: str = "cudnn",
        want=ARMS) -> dict:
    torch.manual_seed(0)
    B, ctx, L = cfg["batch"], cfg["context"], cfg["layers"]
    W = make_weights(cfg, device)
    g = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(B, cfg["hidden"], generator=g, device=device).bfloat16()
    shape = (B, ctx, cfg["kv_heads"], cfg["head_dim"])
    kc0 = [torch.randn(*shape, generator=g, device=device).bfloat16() for _ in range(L)]
    vc0 = [torch.randn(*shape, generator=g, device=device).bfloat16() for _ in range(L)]
    draws = draw_lens(max(16, reps), B, ctx).to(device)
    lens = draws[0].clone()
    stock, pipe = Ops(), (Ops(exported, names) if exported else None)
    res: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
                 "shape": dict(cfg), "sdpa": pin_sdpa(sdpa, device), "eps": EPS,
                 "lens_draws": draws[:2].tolist(), "arms": {}}
    if pipe is not None:
        res["names"] = [p.__name__ for p in pipe.pkgs]
        if device == "cuda":
            pipe.preload()
    arms = make_arms(stock, pipe, W, cfg, want)
    # the reference: the same step in float32 from the same values (its own copy of the caches)
    exact = (exact_ops(), in_f32(W), x.float(), [c.float() for c in kc0], [c.float() for c in vc0])
    statics, graphs, outs, errors = {}, {}, {}, {}
    for name, fn in arms.items():  # each arm writes its own copy of the caches
        statics[name] = (x, lens, [c.clone() for c in kc0], [c.clone() for c in vc0])
        try:
            if device == "cuda":
                graphs[name], outs[name] = captured(fn, statics[name])
        except Exception as e:  # noqa: BLE001 - an arm that cannot run is a finding; the others go on
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            if name == "torch":
                raise
    del kc0, vc0

    def once(name):
        if device == "cuda":
            graphs[name].replay()
            torch.cuda.synchronize()
            return tuple(o.clone() for o in outs[name])
        return arms[name](*statics[name])

    # the check: every arm at two draws of the lengths, against the torch arm's outputs
    seen = {n: [] for n in arms if n not in errors}
    exact_out = []
    for i in range(2):
        lens.copy_(draws[i])
        exact_out.append(step(exact[0], exact[1], cfg, exact[2], lens, exact[3], exact[4]))
        for name in seen:
            try:
                seen[name].append(once(name))
            except Exception as e:  # noqa: BLE001
                if name == "torch":
                    raise
                errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        seen = {n: v for n, v in seen.items() if n not in errors}
    ref = seen["torch"]

    def error(name):  # an arm's distance from the float32 step, at both draws
        return (max(max_diff(o[0], e[0]) for o, e in zip(seen[name], exact_out)),
                max(max_diff(o[1], e[1]) for o, e in zip(seen[name], exact_out)))

    # The tolerance: an arm may be as far from the float32 step as twice the stock arms' bf16
    # steps are (torch's, and torch.compile's where it ran: bf16 rounding, fused differently,
    # compounds through the layers; on an H100 torch.compile's probs were 2.4 times torch's),
    # and never less than a floor of bf16 rounding on the outputs' scale
    stock = {n: error(n) for n in ("torch", "torch.compile") if n in seen}
    ex, ep = max(e[0] for e in stock.values()), max(e[1] for e in stock.values())
    floor_x = 2e-2 * max(float(r[0].float().abs().max()) for r in ref) + 5e-2
    floor_p = 5e-2 * max(float(r[1].float().max()) for r in ref) + 1e-4
    tol_x, tol_p = max(floor_x, 2 * ex), max(floor_p, 2 * ep)
    res["tolerance"] = {"hidden": tol_x, "probs": tol_p, "stock_error": {"hidden": ex, "probs": ep},
                        "stock_arms": sorted(stock),
                        "basis": "an arm's distance from the float32 step, at most twice the larger of the "
                                 "stock arms' or the floor, whichever is larger"}
    # the lengths matter: the two draws' outputs differ by more than the tolerance, so an arm
    # that replayed stale lengths (or kept the first draw's results) would fail the check
    dx, dp = max_diff(exact_out[0][0], exact_out[1][0]), max_diff(exact_out[0][1], exact_out[1][1])
    res["refresh"] = {"max_abs_diff_hidden": dx, "max_abs_diff_probs": dp, "changes": dx > tol_x and dp > tol_p}
    for name in arms:
        if name in errors:
            res["arms"][name] = {"error": errors[name], "ok": False}
            continue
        dx = max(max_diff(o[0], r[0]) for o, r in zip(seen[name], ref))
        dp = max(max_diff(o[1], r[1]) for o, r in zip(seen[name], ref))
        ex, ep = error(name)
        res["arms"][name] = {"max_abs_diff_hidden": dx, "max_abs_diff_probs": dp,
                             "error_hidden": ex, "error_probs": ep,
                             # a stock arm sets the tolerance, so it holds by construction: its check is
                             # the one against NaN (which fails both); the pipe arms' is the check
                             "ok": ex <= tol_x and ep <= tol_p, **({"basis": True} if name in stock else {})}
    if device == "cuda":
        live = [n for n in graphs if n not in errors]
        per = {n: [] for n in live}
        for r in range(rounds):  # interleaved rounds; the order alternates; every arm the same draws
            for name in (live if r % 2 == 0 else live[::-1]):
                per[name].append(statistics.median(time_graph(graphs[name], lens, draws, r * reps, reps)))
        fold_rounds(res["arms"], per)
    if pipe is not None:
        res["pipe_calls"] = pipe.calls()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exported", type=Path, help="folder holding the exported packages (pipe export --out)")
    ap.add_argument("--names", default=",".join(NAMES),
                    help=f"the decode-attention, RMSNorm and softmax packages in it (default {','.join(NAMES)})")
    cuda = torch.cuda.is_available()
    ap.add_argument("--batch", type=int, default=8 if cuda else 2)
    ap.add_argument("--context", type=int, default=8192 if cuda else 64,
                    help="the KV caches' length LMAX; each draw of the lengths has one sequence at it")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=14336 if cuda else 512)
    ap.add_argument("--vocab", type=int, default=32768 if cuda else 1024)
    ap.add_argument("--sdpa", default="cudnn", choices=["cudnn", "default", "math", "flash", "efficient"],
                    help="the SDPA backend of the torch arms on CUDA (default cudnn: the one that takes a "
                         "mask with GQA fast)")
    ap.add_argument("--arms", default=",".join(ARMS), help="the arms to run (torch always)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    want = set(a.arms.split(","))
    if not want <= set(ARMS):
        ap.error(f"--arms: unknown {', '.join(sorted(want - set(ARMS)))} (of {', '.join(ARMS)})")
    names = tuple(a.names.split(","))
    if len(names) != 3:
        ap.error("--names takes three packages: decode attention, RMSNorm, softmax")
    if a.exported is not None and not a.exported.is_dir():
        ap.error(f"--exported {a.exported}: no such folder")
    cfg = {"batch": a.batch, "context": a.context, "layers": a.layers, "heads": a.heads, "kv_heads": a.kv_heads,
           "head_dim": a.head_dim, "hidden": a.heads * a.head_dim, "ffn": a.ffn, "vocab": a.vocab}
    t0 = time.time()
    with torch.no_grad():
        res = run(a.exported, names, cfg, a.reps, a.rounds, "cuda" if cuda else "cpu", a.sdpa, want)
    res["wall_s"] = round(time.time() - t0, 1)
    print(f"{res['device']}, torch {res['torch']}, SDPA {res['sdpa']}, {res['shape']}")
    for name, r in res["arms"].items():
        if "error" in r:
            print(f"  {name:<14} FAILED: {r['error']}")
            continue
        t = arm_time(r, 1e6, "us", "9.1f")
        print(f"  {name:<14} {t}  max |diff| from torch: hidden {r['max_abs_diff_hidden']:.3g}, probs "
              f"{r['max_abs_diff_probs']:.3g}; from the float32 step: {r['error_hidden']:.3g}, "
              f"{r['error_probs']:.3g}" + ("" if r["ok"] else "  (outside tolerance)")
              + ("  (a basis of the tolerance)" if r.get("basis") else ""))
    rf, tol = res["refresh"], res["tolerance"]
    print(f"  tolerance from the float32 step: hidden {tol['hidden']:.3g}, probs {tol['probs']:.3g} (twice the "
          f"stock arms' {tol['stock_error']['hidden']:.3g}, {tol['stock_error']['probs']:.3g}, or the bf16 floor)")
    print(f"  new lengths change the float32 step's outputs by {rf['max_abs_diff_hidden']:.3g} (hidden), "
          f"{rf['max_abs_diff_probs']:.3g} (probs)" + ("" if rf["changes"] else ": NOT MORE than the tolerance, "
                                                       "the check has no teeth"))
    if "pipe_calls" in res:
        print(f"  exported ops: {res['pipe_calls']}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0 if rf["changes"] and all(r["ok"] for r in res["arms"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
