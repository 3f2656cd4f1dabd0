"""What the end-to-end benchmarks (e2e.py, decode_step.py) share: a step captured into a
CUDA graph, and the interleaved rounds' medians folded into each arm's figures."""

from __future__ import annotations

import statistics

import torch


def captured(fn, static: tuple):
    """fn(*static) captured into a CUDA graph, warmed up first on the stream that captures (an
    exported op that allocates a workspace per stream does so outside the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*static)
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = fn(*static)
    torch.cuda.current_stream().wait_stream(s)
    return g, out


def fold_rounds(arms: dict, per: dict[str, list[float]]) -> None:
    """Each timed arm's time (the median of its rounds' medians), its rounds, and its speedup
    over the torch arm with its spread (the lowest and highest ratio round by round); an arm
    whose output was wrong gets no speedup."""
    for name, ts in per.items():
        arms[name]["time_s"] = statistics.median(ts)
        arms[name]["rounds_s"] = ts
    base = arms["torch"]["time_s"]
    for a in arms.values():
        if "time_s" in a:
            a["speedup_vs_torch"] = base / a["time_s"] if a["ok"] else None
            # its spread: the speedup round by round (the arms of a round timed side by side)
            pairs = [b / t for b, t in zip(arms["torch"]["rounds_s"], a["rounds_s"]) if t > 0]
            a["speedup_range"] = [min(pairs), max(pairs)] if a["ok"] and pairs else None


def arm_time(r: dict, scale: float, unit: str, fmt: str) -> str:
    """An arm's time for the printout: its time in `unit` (seconds times `scale`, formatted by
    `fmt`), and its speedup over torch, or WRONG OUTPUT, or that the CPU times nothing."""
    if "time_s" not in r:
        return "(not timed on CPU)"
    t = f"{format(r['time_s'] * scale, fmt)} {unit}"
    if r["speedup_vs_torch"] is None:
        return f"{t}  WRONG OUTPUT"
    lo_hi = r.get("speedup_range")
    return f"{t}  {r['speedup_vs_torch']:.3f}x" + (f" [{lo_hi[0]:.3f}..{lo_hi[1]:.3f}]" if lo_hi else "")
