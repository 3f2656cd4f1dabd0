"""End to end: a transformer block's evaluation step with pipe's exported ops.

One pre-norm decoder block (RMSNorm, causal attention with an explicit softmax,
RMSNorm, SwiGLU MLP), the final RMSNorm, the LM head and the per-token
cross-entropy with ignored targets, in bf16. Three arms, each captured into a
CUDA graph and timed by replaying it (production mode):

- torch: stock torch ops;
- torch.compile: the same function compiled by inductor (default mode), then captured;
- pipe: the exported softmax, RMSNorm and cross-entropy ops in place of torch's
  (the rest unchanged), then captured; `pipe+compile` adds torch.compile around it
  (the exported ops stay opaque custom ops inside the compiled graph).

Outputs (the block's hidden state and the loss per token) are compared with
the torch arm. Usage (after `pipe export` of the three runs into DIR):

    python benchmarks/e2e.py --exported DIR [--seq 4096 --hidden 4096 --heads 32 --vocab 32000]

On a machine without CUDA it runs the arms eagerly on the CPU with small
defaults (no graphs, no timing claims): a check of the wiring.
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


class Ops:
    """softmax, rmsnorm and cross_entropy: torch's, or the exported packages'."""

    def __init__(self, exported: Path | None = None, names=("softmax_h200", "rmsnorm_h200", "cross_entropy_h200")):
        self.pkgs = []
        if exported is None:
            self.softmax = lambda x: torch.softmax(x, dim=-1)
            self.rmsnorm = lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps)
            self.cross_entropy = lambda lg, t, ig: F.cross_entropy(lg.float(), t, ignore_index=ig, reduction="none")
            return
        missing = [n for n in names if not (exported / n / "__init__.py").is_file()]
        if missing:
            raise SystemExit(f"e2e: {exported} lacks the exported package(s) {', '.join(missing)}: "
                             f"make them with `pipe export RUN --out {exported}` for the softmax, RMSNorm "
                             f"and cross-entropy runs")
        sys.path.insert(0, str(exported))
        sm, rn, ce = (importlib.import_module(n) for n in names)
        self.pkgs = [sm, rn, ce]
        self.softmax, self.rmsnorm, self.cross_entropy = sm.softmax, rn.rmsnorm, ce.cross_entropy

    def calls(self) -> dict:
        return {p.__name__: dict(p.op.calls) for p in self.pkgs}


def make_weights(hidden: int, ffn: int, vocab: int, device: str, seed: int = 0) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)

    def w(*shape, scale):
        return (torch.randn(*shape, generator=g, device=device) * scale).bfloat16()

    return {"n1": (torch.rand(hidden, generator=g, device=device) + 0.5).bfloat16(),
            "n2": (torch.rand(hidden, generator=g, device=device) + 0.5).bfloat16(),
            "nf": (torch.rand(hidden, generator=g, device=device) + 0.5).bfloat16(),
            "qkv": w(hidden, 3 * hidden, scale=hidden ** -0.5), "o": w(hidden, hidden, scale=hidden ** -0.5),
            "w1": w(hidden, ffn, scale=hidden ** -0.5), "w3": w(hidden, ffn, scale=hidden ** -0.5),
            "w2": w(ffn, hidden, scale=ffn ** -0.5), "lm": w(hidden, vocab, scale=hidden ** -0.5)}


def step(ops: Ops, W: dict, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, heads: int):
    """One evaluation step: the block, the final norm, the LM head, the loss per token."""
    seq, hidden = x.shape
    hd = hidden // heads
    h = ops.rmsnorm(x, W["n1"], 1e-6)
    q, k, v = (h @ W["qkv"]).view(seq, 3, heads, hd).permute(1, 2, 0, 3)
    scores = (q @ k.transpose(-1, -2)) * hd ** -0.5
    scores = scores.masked_fill(mask, float("-inf"))
    p = ops.softmax(scores.reshape(heads * seq, seq)).view(heads, seq, seq)
    x = x + ((p @ v).transpose(0, 1).reshape(seq, hidden) @ W["o"])
    h = ops.rmsnorm(x, W["n2"], 1e-6)
    x = x + ((F.silu(h @ W["w1"]) * (h @ W["w3"])) @ W["w2"])
    logits = ops.rmsnorm(x, W["nf"], 1e-6) @ W["lm"]
    return x, ops.cross_entropy(logits, targets, -100)



def time_graph(g, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def run(exported: Path | None, seq: int, hidden: int, heads: int, vocab: int, reps: int, rounds: int,
        device: str) -> dict:
    torch.manual_seed(0)
    W = make_weights(hidden, int(hidden * 8 / 3) // 64 * 64, vocab, device)
    x = torch.randn(seq, hidden, device=device).bfloat16()
    targets = torch.randint(0, vocab, (seq,), device=device)
    targets[::17] = -100
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), 1)
    stock, pipe = Ops(), Ops(exported) if exported else None
    arms = {"torch": lambda *a: step(stock, W, *a, heads),
            "torch.compile": torch.compile(lambda *a: step(stock, W, *a, heads))}
    if pipe is not None:
        arms["pipe"] = lambda *a: step(pipe, W, *a, heads)
        arms["pipe+compile"] = torch.compile(lambda *a: step(pipe, W, *a, heads))
    static = (x, targets, mask)
    res: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
                 "shape": {"seq": seq, "hidden": hidden, "heads": heads, "vocab": vocab}, "arms": {}}
    outs, graphs = {}, {}
    for name, fn in arms.items():
        if device == "cuda":
            graphs[name], outs[name] = captured(fn, static)
            graphs[name].replay()
            torch.cuda.synchronize()
        else:
            outs[name] = fn(*static)
    ref_x, ref_loss = outs["torch"]
    tol_x = 2e-2 * float(ref_x.float().abs().max()) + 5e-2  # bf16 rounding of differently fused arithmetic
    tol_l = 2e-2 * float(ref_loss.float().abs().max()) + 5e-2
    for name, (ox, ol) in outs.items():
        dx = float((ox.float() - ref_x.float()).abs().max())
        dl = float((ol.float() - ref_loss.float()).abs().max())
        res["arms"][name] = {"max_abs_diff_hidden": dx, "max_abs_diff_loss": dl, "loss_mean": float(ol.float().mean()),
                             "ok": dx <= tol_x and dl <= tol_l}  # NaN fails both
    if device == "cuda":
        per = {n: [] for n in graphs}
        for r in range(rounds):  # interleaved rounds; the order alternates
            for name in (list(graphs) if r % 2 == 0 else list(graphs)[::-1]):
                per[name].append(statistics.median(time_graph(graphs[name], reps)))
        fold_rounds(res["arms"], per)
    if pipe is not None:
        res["pipe_calls"] = pipe.calls()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exported", type=Path, help="folder holding the exported packages (pipe export --out)")
    cuda = torch.cuda.is_available()
    ap.add_argument("--seq", type=int, default=4096 if cuda else 64)
    ap.add_argument("--hidden", type=int, default=4096 if cuda else 128)
    ap.add_argument("--heads", type=int, default=32 if cuda else 4)
    ap.add_argument("--vocab", type=int, default=32000 if cuda else 1000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    t0 = time.time()
    res = run(a.exported, a.seq, a.hidden, a.heads, a.vocab, a.reps, a.rounds, "cuda" if cuda else "cpu")
    res["wall_s"] = round(time.time() - t0, 1)
    print(f"{res['device']}, torch {res['torch']}, {res['shape']}")
    for name, r in res["arms"].items():
        t = arm_time(r, 1e3, "ms", "8.3f")
        print(f"  {name:<14} {t}  max |diff| hidden {r['max_abs_diff_hidden']:.3g}, loss {r['max_abs_diff_loss']:.3g}"
              + ("" if r["ok"] else "  (outside tolerance)"))
    if "pipe_calls" in res:
        print(f"  exported ops: {res['pipe_calls']}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0 if all(r["ok"] for r in res["arms"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
