"""From per-shape times to figures: the physical floor, fractions of the
limit, speedups, the goal's metric and the search objective.

floor(shape) = max(bytes / measured bandwidth, flops / peak rate of the dtype), the bandwidth
the copy figure, or the read-only one for an op whose op.traffic is "read"
A time below floor * (1 - profile slack) is physically impossible: the kernel
skipped work or the timing was fooled, and the trial is rejected.
"""

from __future__ import annotations

import math
from typing import Sequence



def shape_label(shape: dict) -> str:
    """32768x4096: a shape's sizes in the spec's order."""
    return "x".join(str(v) for v in shape.values())

def floors(spec, shapes=None) -> list[dict]:
    """Per shape (the spec's timed shapes by default): bytes, flops and the floor time."""
    out = []
    hw, op = spec.hw, spec.op
    peak = hw.peak_flops(op.dtype)
    for shape in (op.shapes if shapes is None else shapes):
        env = op.shape_env(shape)
        nbytes = float(op.bytes(env))
        flops = float(op.flops(env)) if op.flops is not None else None
        t_bw = nbytes / hw.bandwidth_for(getattr(op, "traffic", "copy"))
        t_fl = flops / peak if (flops and peak) else 0.0
        out.append({"bytes": nbytes, "flops": flops, "t_bw": t_bw, "t_flops": t_fl, "floor": max(t_bw, t_fl)})
    return out


# runtime.mode auto: graph replay where a shape's physical floor is shorter than this, direct
# launches where it is longer (launch_mode)
GRAPH_BELOW_S = 20e-6


def launch_mode(spec, shape: dict) -> str | None:
    """The launch mode of every arm timed at `shape` (candidates, torch's arms, the copy): the
    spec's runtime.mode where it names one; in auto mode, graph replay where the shape's
    physical floor (floors) is under GRAPH_BELOW_S and direct launches where it is not.
    The runner decides it from the op's bytes and flops alone, never from a candidate's own
    timing: a kernel that spun on its first calls (the ones on a fresh output buffer) would
    otherwise choose how the arms it is measured against are launched. None without a mode
    (the CPU backend)."""
    mode = getattr(spec.runtime, "mode", None)
    if mode != "auto":
        return mode
    return "graph" if floors(spec, [shape])[0]["floor"] < GRAPH_BELOW_S else "direct"


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def objective(times: Sequence, baseline: Sequence[float] | None) -> float:
    """The search objective: the geomean of the times. A shape without a time (a configuration
    that does not serve it, op.domain) counts at the baseline's time there: the fallback."""
    if all(t is not None for t in times):
        return geomean(times)
    if not baseline:
        return geomean([t for t in times if t is not None])
    return geomean([b if t is None else t for t, b in zip(times, baseline)])


def per_shape(spec, times: Sequence, baseline: Sequence[float] | None) -> list[dict]:
    """Figures per timed shape; a shape without a time (not served) has time_s None only."""
    out = []
    for i, (t, f) in enumerate(zip(times, floors(spec))):
        if t is None:
            out.append({"time_s": None})
            continue
        d = {"time_s": t, "floor_s": f["floor"], "bytes_per_s": f["bytes"] / t,
             "bandwidth_fraction": f["t_bw"] / t, "limit_fraction": f["floor"] / t,
             "flops_fraction": (f["t_flops"] / t) if f["t_flops"] else None}
        if baseline:
            d["baseline_s"] = baseline[i]
            d["speedup"] = baseline[i] / t
        out.append(d)
    return out


def below_floor(spec, time_s: float | None, floor_s: float) -> str | None:
    """Why one time is physically impossible (under its floor by more than the profile's
    slack), or None."""
    if time_s is None or time_s >= floor_s * (1 - spec.hw.limit_slack):
        return None
    return (f"{time_s * 1e6:.3f} us is below the physical floor {floor_s * 1e6:.3f} us "
            f"({floor_s / time_s:.2f}x the {spec.hw.name} limit)")


def impossible(spec, shapes: list[dict]) -> str | None:
    for i, d in enumerate(shapes):
        if d["time_s"] is None:  # a shape the configuration does not serve has no floor either
            continue
        why = below_floor(spec, d["time_s"], d["floor_s"])
        if why:
            return f"shape {i}: {why}"
    return None


def metric(spec, shapes: list[dict]) -> float | None:
    """The goal's metric over all shapes: the worst shape counts. With op.domain, over the
    listed shapes only (the tuning grid builds the dispatch table), and None unless the
    configuration serves every one of them."""
    if spec.op.domain:
        shapes = shapes[:spec.op.named]
        if any(d["time_s"] is None for d in shapes):
            return None
    m = spec.goal.metric or ("speedup" if shapes and "speedup" in shapes[0] else None)
    if m is None:
        return None
    if m == "time_us":
        return max(d["time_s"] for d in shapes) * 1e6
    vals = [d.get(m) for d in shapes]
    if any(v is None for v in vals):
        return None
    return min(vals)


def metric_spread(spec, shapes: list[dict], spreads: Sequence[float] | None,
                  baseline_spreads: Sequence[float] | None = None) -> float | None:
    """The relative spread of the goal's metric: the interquartile spread over the median of
    the shape that sets it (the worst), plus the baseline's own on that shape for a speedup
    (both times move the ratio)."""
    if spec.op.domain:
        shapes, spreads = shapes[:spec.op.named], (spreads or [])[:spec.op.named]
        if any(d["time_s"] is None for d in shapes):
            return None
    m = spec.goal.metric or ("speedup" if shapes and "speedup" in shapes[0] else None)
    if m is None or not spreads or not shapes:
        return None
    if m == "time_us":
        i = max(range(len(shapes)), key=lambda k: shapes[k]["time_s"])
    else:
        vals = [d.get(m) for d in shapes]
        if any(v is None for v in vals):
            return None
        i = min(range(len(vals)), key=lambda k: vals[k])
    s = spreads[i] if i < len(spreads) else 0.0
    if m == "speedup" and baseline_spreads and i < len(baseline_spreads):
        s += baseline_spreads[i]
    return s


# A trial that beats a shape's best time by more than this counts as progress for the goal's
# patience (timing noise between kernels is well under it; notebook/kernels.md)
SHAPE_PROGRESS = 0.005


def table_metric(spec, history, baseline: Sequence[float] | None) -> float | None:
    """The goal's metric for the dispatch table a run ships: each timed shape's fastest ok
    trial so far. None until every timed shape has one."""
    n = len(spec.op.shapes)
    rows = per_shape_best(history, n)
    if any(r is None for r in (rows[:spec.op.named] if spec.op.domain else rows)):
        return None
    return metric(spec, per_shape(spec, [r["time_s"] if r else None for r in rows], baseline))


class Progress:
    """Trial by trial: whether a trial was faster on some shape than every earlier trial by
    more than `tol` (the first trial with times counts). With the best configuration's own
    trial, these are the trials that count as progress for the goal's patience."""

    def __init__(self, tol: float = SHAPE_PROGRESS):
        self.tol, self.table = tol, None

    def add(self, t) -> bool:
        if t.status != "ok" or not t.times:
            return False
        times = [math.inf if x is None else x for x in t.times]  # None: a shape it does not serve
        if self.table is None:
            self.table = times
            return True
        moved = any(x < b * (1 - self.tol) for x, b in zip(times, self.table))
        self.table = [min(x, b) for x, b in zip(times, self.table)]
        return moved


def progress_marks(history, tol: float = SHAPE_PROGRESS) -> list[bool]:
    """Progress.add over a whole history."""
    p = Progress(tol)
    return [p.add(t) for t in history]


def last_progress(history, best_index: int) -> int:
    """The index in `history` of the last trial that made progress: the best configuration's
    (`best_index`, -1 for none) or a later one marked by progress_marks. -1 if none."""
    marks = progress_marks(history)
    return max(best_index, max((i for i, m in enumerate(marks) if m), default=-1))


def per_shape_best(history, n_shapes: int) -> list[dict | None]:
    """For each timed shape, the ok trial with the lowest recorded time on it."""
    out: list[dict | None] = []
    for i in range(n_shapes):
        ok = [t for t in history if t.status == "ok" and t.times and len(t.times) > i and t.times[i] is not None]
        if not ok:
            out.append(None)
            continue
        t = min(ok, key=lambda t: t.times[i])
        out.append({"trial": t.id, "params": t.params, "variant": t.variant, "time_s": t.times[i]})
    return out
