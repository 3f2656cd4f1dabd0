"""`pipe report RUN`: a self-contained HTML report and a markdown summary.

Everything comes from the run folder: the ledger (every trial), the recorded
baseline, `compare.json` when `pipe compare` has run, and the spec (for the
floors and the roofline) when it still hashes to what the run recorded.
Plots are matplotlib PNGs embedded as data URIs: the page opens from disk with
no server and no network.

Plots: the best-so-far curve against trials and against wall time, every
trial's status, per-shape speedups over the baseline (and over the other arms
of `pipe compare`), and each shape against the profile's roofline; where the
profile's bandwidth is not a measurement (host-cpu's is an upper bound), no
roof but each trial's achieved bandwidth per shape, and a sentence saying why.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sqlite3
import math
from pathlib import Path

from ..core import figures

STATUS_COLORS = {"ok": "#2b8a3e", "wrong": "#c92a2a", "fault": "#862e9c", "hang": "#e67700",
                 "forbidden": "#495057", "pruned": "#868e96", "compile_error": "#1864ab",
                 "render_error": "#1864ab", "impossible": "#d9480f", "tampered": "#000000",
                 "crashed": "#5f3dc4", "error": "#a61e4d"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def load(run_dir: Path, spec_path: str | None = None, force: bool = False) -> dict:
    from ..ledger.ledger import Ledger
    from ..ledger.rundir import guard
    from ..ledger.summary import confinement

    led = Ledger.read(run_dir, damaged_ok=True)
    try:
        check = guard(run_dir, led, force, "report on it")
        trials = check.trials
        meta = {k: led.get_meta(k) for k in ("spec_name", "spec_path", "spec_hash", "baseline", "goal_checks",
                                             "spec_abspath")}
        intact = check.intact
        records, kept = led.compares(), led.get_meta("compare_kept") is not None  # compare.json's record
        try:  # a command agent's confinement, as the run recorded it (search/agents/confine.py)
            agent = confinement(led.replies())
        except sqlite3.DatabaseError:
            agent = None
    finally:
        led.close()
    spec = None
    from ..spec.spec import load_spec
    from .rundata import recorded_spec_path, run_spec

    if spec_path is not None:  # named on the command line: one that cannot be read is an error
        if not Path(spec_path).is_file():
            from .rundata import RunMismatch

            raise RunMismatch(f"--spec {spec_path}: no such file")
        spec = run_spec(spec_path, meta["spec_hash"], run_dir, "report on")
    else:
        try:
            s = load_spec(recorded_spec_path(run_dir, meta["spec_path"], meta["spec_abspath"], meta["spec_hash"]))
            spec = s if s.hash == meta["spec_hash"] else None
        except Exception:  # the spec moved or changed: the report goes on without floors
            spec = None
    from .rundata import compare_problem, read_compare_bytes

    compare, sha = read_compare_bytes(run_dir, len(spec.op.shapes) if spec is not None and not spec.op.domain else None)
    # a compare.json that is not the file pipe compare last wrote: its figures are left out, and said so
    compare_changed = compare_problem(run_dir, sha, records[-1] if records else None, kept)
    if compare_changed:
        from ..core import log

        log.get().warning("report.compare_changed", run=str(run_dir), reason=compare_changed)
        compare = None
    baseline = json.loads(meta["baseline"]) if meta["baseline"] else None
    checks = json.loads(meta["goal_checks"] or "[]")
    return {"run": str(run_dir), "trials": trials, "meta": meta, "spec": spec, "compare": compare,
            "baseline": baseline, "intact": intact, "goal_check": checks[-1] if checks else None,
            "agent": agent["detail"] if agent else None, "compare_changed": compare_changed}


def _labels(data) -> list[str]:
    if data["spec"] is not None:
        return [figures.shape_label(s) for s in data["spec"].op.shapes]
    n = max((len(t.times) for t in data["trials"] if t.times), default=0)
    return [f"shape {i}" for i in range(n)]


def plot_progress(data) -> str:
    plt = _plt()
    trials = data["trials"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    best, xs, ys, ws, clock = None, [], [], [], 0.0
    for t in trials:
        clock += t.wall_s or 0.0
        if t.kept and t.objective:
            best = t.objective
        if best is not None:
            xs.append(t.id)
            ws.append(clock)
            ys.append(best * 1e6)
    oks = [t for t in trials if t.status == "ok" and t.objective]
    a.scatter([t.id for t in oks], [t.objective * 1e6 for t in oks], s=10, color="#adb5bd", label="each correct trial")
    a.step(xs, ys, where="post", color="#1c7ed6", marker=".", label="best so far (kept)")
    a.set_xlabel("trial")
    a.set_ylabel("geometric-mean time (us)")
    a.legend(fontsize=8)
    b.step(ws, ys, where="post", color="#1c7ed6", marker=".")
    b.set_xlabel("wall time of the trials (s)")
    b.set_ylabel("best so far (us)")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    return _png(fig)


def plot_status(data) -> str:
    plt = _plt()
    trials = data["trials"]
    fig, ax = plt.subplots(figsize=(11, 2.8))
    oks = [t.objective * 1e6 for t in trials if t.status == "ok" and t.objective]
    top = max(oks) * 1.15 if oks else 1.0
    for status in sorted({t.status for t in trials}):
        pts = [t for t in trials if t.status == status]
        y = [t.objective * 1e6 if (status == "ok" and t.objective) else top for t in pts]
        ax.scatter([t.id for t in pts], y, s=14, color=STATUS_COLORS.get(status, "#343a40"),
                   label=f"{status} ({len(pts)})")
    ax.set_xlabel("trial")
    ax.set_ylabel("time (us); failures on top")
    ax.legend(fontsize=8, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.grid(alpha=0.3)
    return _png(fig)


# pipe compare's arms on the range curve; the spec's named arms (op.arms) take NAMED_COLORS in order
ARM_COLORS = {"table": "#1864ab", "torch eager": "#868e96", "torch.compile": "#e8590c", "triton": "#2b8a3e",
              "copy": "#adb5bd"}
NAMED_COLORS = ("#9c36b5", "#c2255c", "#1098ad", "#f59f00", "#5c940d", "#364fc7", "#d6336c", "#0b7285")


def arm_colors(names) -> dict[str, str]:
    """A colour per arm: the built-in arms keep theirs, each named arm (op.arms) the next of NAMED_COLORS."""
    named = [n for n in dict.fromkeys(names) if n not in ARM_COLORS]
    return {**ARM_COLORS, **{n: NAMED_COLORS[i % len(NAMED_COLORS)] for i, n in enumerate(named)}}


def plot_speedups(data, rows) -> str | None:
    if not rows:
        return None
    from .compare import ARMS

    plt = _plt()
    arms = [k for k in rows[0] if k.startswith("vs ") and not k.endswith(" range")]
    # the built-in arms and the run's baseline first, in matplotlib's colours as before; then op.arms'
    builtin = [k for k in arms if k[3:] in ARMS or k == "vs run baseline"]
    named = [k for k in arms if k not in builtin]
    arms = builtin + named
    colors = {**{k: f"C{j}" for j, k in enumerate(builtin)}, **{k: arm_colors(n[3:] for n in named)[k[3:]]
                                                                 for k in named}}
    fig, ax = plt.subplots(figsize=(11, 3.4))
    width = 0.8 / max(1, len(arms))
    for j, arm in enumerate(arms):
        vals = [r[arm] or 0.0 for r in rows]
        # error bars: the lowest and highest ratio over pipe compare's paired rounds
        rg = [r.get(f"{arm} range") or (v, v) for r, v in zip(rows, vals)]
        err = [[max(0.0, v - lo) for v, (lo, _) in zip(vals, rg)], [max(0.0, hi - v) for v, (_, hi) in zip(vals, rg)]]
        ax.bar([i + j * width for i in range(len(rows))], vals, width, label=arm, yerr=err, capsize=3,
               color=colors[arm])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([i + width * (len(arms) - 1) / 2 for i in range(len(rows))], [r["shape"] for r in rows])
    ax.set_ylabel("speedup of the tuned kernel")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def roofline_note(data) -> str | None:
    """Why the report draws no roofline, where the profile's bandwidth is not a measurement."""
    spec = data["spec"]
    if spec is None or spec.hw.bandwidth_measured:
        return None
    hw = spec.hw
    return (f"No roofline: the {hw.name} profile's bandwidth ({hw.bandwidth / 1e9:.0f} GB/s) is not a "
            f"measurement of this machine ({hw.bandwidth_source}), so a roof drawn from it would put every "
            "kernel far under a ceiling that is not there. The plot gives each correct trial's achieved "
            "bandwidth per shape instead (bytes moved over the recorded time), with no roof.")


def plot_roofline(data, rows) -> str | None:
    """Each shape against the profile's roofline; where the profile's bandwidth is not measured
    (see roofline_note), each correct trial's achieved bandwidth per shape, with no roof."""
    spec = data["spec"]
    if spec is None or not rows:
        return None
    if not spec.hw.bandwidth_measured:
        return _plot_achieved_bandwidth(data)
    plt = _plt()
    hw = spec.hw
    peak = hw.peak_flops(spec.op.dtype) or hw.peak_flops("fp32")
    fl = figures.floors(spec)
    pts = []
    for r, f in zip(rows, fl):
        if f["flops"] and r.get("time_s"):
            pts.append((f["flops"] / f["bytes"], f["flops"] / r["time_s"], r["shape"]))
    if not pts or not peak:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lo = min(p[0] for p in pts) / 4
    hi = max(max(p[0] for p in pts) * 4, peak / hw.bandwidth * 4)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * hw.bandwidth) for x in xs], color="black",
            label=f"{hw.name}: {hw.bandwidth / 1e12:.2f} TB/s, {peak / 1e12:.0f} TFLOP/s")
    # shapes of one op often share an arithmetic intensity and sit a hair apart: each point
    # is named in the legend (its own colour and marker) rather than by a label beside it,
    # where the labels of neighbouring points would overlap
    markers = "osD^v<>ph*"
    for i, (x, y, label) in enumerate(pts):
        ax.scatter([x], [y], s=34, marker=markers[i % len(markers)], zorder=3, label=label)
    from matplotlib.ticker import NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    ax.grid(alpha=0.3, which="both")
    return _png(fig)


def _plot_achieved_bandwidth(data) -> str | None:
    spec = data["spec"]
    fl = figures.floors(spec)
    labels = _labels(data)
    oks = [t for t in data["trials"] if t.status == "ok" and t.times]
    if not oks:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    markers = "osD^v<>ph*"
    for i, (f, label) in enumerate(zip(fl, labels)):
        pts = [(t.id, f["bytes"] / t.times[i] / 1e9) for t in oks if len(t.times) > i and t.times[i]]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)], ms=4, lw=0.8,
                    label=label)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("achieved bandwidth (GB/s)")
    ax.set_title(f"no roof: {spec.hw.name}'s bandwidth is not measured", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    ax.grid(alpha=0.3)
    return _png(fig)


def shape_rows(data) -> list[dict]:
    """Per shape: the kernel to use there and its figures. From `pipe compare` when it has
    run (the winner of a fresh side-by-side timing, or the baseline where it won), else
    from the recorded per-shape best."""
    labels = _labels(data)
    rows = []
    cmp = data["compare"]
    base = (data["baseline"] or {}).get("times")
    if cmp and not cmp.get("range_table"):
        for s in cmp["shapes"]:
            t = s["tuned"] or {}
            r = {"shape": s["label"], "source": "pipe compare", "trial": t.get("trial"), "params": t.get("params"),
                 "time_s": t.get("time_s"), "bytes_per_s": t.get("bytes_per_s"),
                 "copy_fraction": t.get("copy_fraction"), "limit_fraction": t.get("limit_fraction")}
            for arm, a in s["arms"].items():
                r[f"vs {arm}"] = a.get("tuned_speedup")
                r[f"vs {arm} range"] = a.get("tuned_speedup_range")  # lowest and highest over paired rounds
            i = len(rows)
            r["vs run baseline"] = (base[i] / t["time_s"]) if base and t.get("time_s") else None
            rows.append(r)
        return _with_dispatch(data, rows, base)
    best = figures.per_shape_best(data["trials"], len(labels))
    fl = figures.floors(data["spec"]) if data["spec"] is not None else None
    for i, b in enumerate(best):
        if b is None:
            rows.append({"shape": labels[i], "source": "ledger", "trial": None, "params": None, "time_s": None,
                         "vs baseline": None})
            continue
        r = {"shape": labels[i], "source": "ledger (recorded time)", "trial": b["trial"], "params": b["params"],
             "time_s": b["time_s"], "vs baseline": (base[i] / b["time_s"]) if base else None}
        if fl:
            r["bytes_per_s"] = fl[i]["bytes"] / b["time_s"]
            r["limit_fraction"] = fl[i]["floor"] / b["time_s"]
        rows.append(r)
    return _with_dispatch(data, rows, base)


def _with_dispatch(data, rows: list[dict], base) -> list[dict]:
    """What `pipe export` would dispatch to on each shape: the kernel, or torch and why."""
    if data["spec"] is None or data["spec"].op.domain:  # a table by range: its own section (curve_rows)
        return rows
    from .export import dispatch_table

    for r, d in zip(rows, dispatch_table(data["spec"], data["trials"], data["compare"], base)):
        r["dispatch"] = f"kernel #{d['trial']}" if d["use"] == "kernel" else f"torch ({d.get('why', '')})"
    return rows


def plot_curve(data) -> str | None:
    """pipe compare's curve over the domain (op.domain): time and TB/s of every arm against
    the range axis, at the secret points; filled markers for the large inputs, hollow for
    the few-row ones."""
    cmp = data["compare"] or {}
    rows, t = cmp.get("curve"), cmp.get("range_table")
    if not rows or not t or len(t["axes"]) != 1:
        return None
    axis = t["axes"][0]
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4))
    big = max(r["bytes"] for r in rows)
    from .compare import extra_arms

    named = extra_arms(r["arms"] for r in rows)  # op.arms: a line each, in a colour of its own
    colors = arm_colors(named)
    arms = [(a, colors[a]) for a in ("table", "torch eager", "torch.compile", "triton", *named, "copy")]
    for name, color in arms:
        for small in (False, True):
            pts = []
            for r in rows:
                if (r["bytes"] < big / 64) != small:
                    continue
                ts = r["table_s"] if name == "table" else (r["arms"].get(name) or {}).get("time_s")
                if ts and not (name != "table" and (r["arms"].get(name) or {}).get("error")):
                    pts.append((r["shape"][axis], ts, r["bytes"] / ts / 1e12))
            if not pts:
                continue
            pts.sort()
            kw = dict(color=color, marker="o", ms=4, lw=0.9 if not small else 0, ls="--" if name == "copy" else "-",
                      mfc="none" if small else color, label=name if not small else None)
            a1.plot([p[0] for p in pts], [p[1] * 1e6 for p in pts], **kw)
            a2.plot([p[0] for p in pts], [p[2] for p in pts], **kw)
    for ax, lab in ((a1, "time (us)"), (a2, "TB/s (the op's bytes)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(axis)
        ax.set_ylabel(lab)
        ax.grid(alpha=0.3)
    a1.set_yscale("log")
    for r in t["ranges"][1:]:
        a2.axvline(r["lo"][axis], color="#dee2e6", lw=0.6, zorder=0)
    a2.legend(fontsize=8)
    a1.set_title("secret points; hollow: few rows", fontsize=9)
    a2.set_title("grey lines: the table's range boundaries", fontsize=9)
    return _png(fig)


def curve_rows(data) -> list[dict]:
    """pipe compare's regret table at the secret points, as rows."""
    from .compare import extra_arms

    out = []
    curve = (data["compare"] or {}).get("curve") or []
    named = extra_arms(r["arms"] for r in curve)
    for r in curve:
        a = r["arms"]

        def us(x):
            return f"{x * 1e6:.2f}" if x else "-"

        def arm_us(n):  # a wrong arm, or one unavailable here, has no time that counts
            d = a.get(n) or {}
            if d.get("error"):
                return "n/a" if d["error"].startswith("unavailable") else "wrong"
            return us(d.get("time_s"))

        out.append({"shape": "x".join(str(v) for v in r["shape"].values()), "table uses": r["use"],
                    "table us": us(r["table_s"]), "TB/s": f"{(r.get('bytes_per_s') or 0) / 1e12:.2f}",
                    "of copy": f"{(r.get('copy_fraction') or 0):.0%}",
                    "eager us": us((a.get("torch eager") or {}).get("time_s")),
                    "compile us": us((a.get("torch.compile") or {}).get("time_s")),
                    "triton us": arm_us("triton"), **{f"{n} us": arm_us(n) for n in named},
                    "regret": f"{(r.get('regret') or 0):+.1%}",
                    "rounds": (f"{r['regret_range'][0]:+.1%} to {r['regret_range'][1]:+.1%}"
                               if r.get("regret_range") else "-"),
                    "best arm": r.get("best_arm") or "-"})
    return out


def _fmt(v, kind: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if kind == "us":
        return f"{v * 1e6:.1f} us"
    if kind == "tbs":
        return f"{v / 1e12:.2f} TB/s"
    if kind == "x":
        return f"{v:.2f}x"
    if kind == "frac":
        return f"{v:.3f}"
    return str(v)


def _columns(rows) -> list[tuple[str, str, str]]:
    cols = [("shape", "shape", ""), ("dispatch", "dispatch", ""), ("trial", "trial", ""), ("time", "time_s", "us"),
            ("bandwidth", "bytes_per_s", "tbs"), ("of the limit", "limit_fraction", "frac")]
    if rows and "copy_fraction" in rows[0]:
        cols.append(("of the copy", "copy_fraction", "frac"))
    for k in (rows[0] if rows else {}):
        if k.startswith("vs ") and not k.endswith(" range"):
            cols.append((k, k, "x"))
    cols.append(("parameters", "params", "json"))
    return cols


def _cell(r, key, kind):
    v = r.get(key)
    if kind == "json":
        return json.dumps(v) if v is not None else "-"
    if key == "trial":
        return f"#{v}" if v is not None else "-"
    rg = r.get(f"{key} range") if kind == "x" else None
    if rg and v is not None:  # a speedup is shown with its spread over pipe compare's paired rounds
        return f"{_fmt(v, kind)} ({rg[0]:.2f}-{rg[1]:.2f})"
    return _fmt(v, kind)


def summary(data) -> dict:
    trials = data["trials"]
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    kept = [t for t in trials if t.kept]
    wall = sum(t.wall_s or 0.0 for t in trials)
    return {"spec": data["meta"]["spec_name"], "trials": len(trials), "by_status": counts,
            "best": kept[-1] if kept else None, "wall_s": wall,
            "per_min": (len(trials) / wall * 60) if wall else None, "intact": data["intact"]}


def time_split(data) -> str | None:
    """Where a judged trial's time goes (medians over the trials the judge timed): building
    (forbidden rules, compiles, limits), verification and timing in the worker, the rest of
    the judge's round trip, and the re-timing of candidates that challenged the incumbent."""
    import statistics

    ts = [t for t in data["trials"] if t.status == "ok" and "judge_wall_s" in (t.details or {})]
    if not ts:
        return None

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    d = [t.details for t in ts]
    parts = [("trial", med([t.wall_s for t in ts])), ("build", med([x.get("build_wall_s") for x in d])),
             ("verification (with launch set-up)", med([(x.get("judge_phases") or {}).get("verify_s") for x in d])),
             ("timing", med([(x.get("judge_phases") or {}).get("time_s") for x in d])),
             ("judge round trip", med([x.get("judge_wall_s") for x in d]))]
    # the timing phase's parts (recorded since session 4)
    sub = [(k, med([(x.get("judge_phases") or {}).get(key) for x in d]))
           for k, key in (("second value set and its reference", "time_setup_s"), ("timed loop", "time_loop_s"),
                          ("output checks", "time_check_s"))]
    rt = [x["retime"]["seconds"] for x in d if isinstance(x.get("retime"), dict) and "seconds" in x["retime"]]
    text = ", ".join(f"{k} {v:.3f} s" for k, v in parts if v is not None)
    if all(v is not None for _, v in sub):
        text += " (timing: " + ", ".join(f"{k} {v:.3f} s" for k, v in sub) + ")"
    if rt:
        text += f"; re-timing {statistics.median(rt):.3f} s in {len(rt)} of {len(ts)} trials"
    return f"Median time of a judged trial ({len(ts)} trial{'s' if len(ts) != 1 else ''}): {text}."


def held_rows(data) -> list[dict]:
    """pipe compare's check of the dispatch table on held-out shapes, as table rows."""
    out = []
    for h in (data["compare"] or {}).get("held_out") or []:
        out.append({"shape": h["label"], "table's choice": h["choice"], "by the rule": h.get("via", "-"),
                    "its time": _fmt(h["choice_s"], "us"),
                    "best there": h["best"] or "-", "best time": _fmt(h["best_s"], "us"),
                    "regret": f"{h['regret']:.1%}" if h["regret"] is not None else "-"})
    return out


def markdown(data, rows) -> str:
    s = summary(data)
    out = [f"# {s['spec']}: run report", "",
           f"Run folder `{data['run']}`; {s['trials']} trials ("
           + ", ".join(f"{k} {v}" for k, v in sorted(s["by_status"].items())) + ")"
           + (f", {s['per_min']:.0f} trials a minute of judge time" if s["per_min"] else "") + "; ledger chain "
           + ("intact" if s["intact"] else "BROKEN") + "."]
    if data.get("agent"):
        out += ["", f"Agent: {data['agent']}."]
    if data.get("compare_changed"):
        out += ["", f"**pipe compare's figures are left out**: {data['compare_changed']}."]
    b = s["best"]
    if b:
        out += ["", f"Best overall: trial #{b.id} `{json.dumps(b.params)}`, geometric-mean time "
                f"{b.objective * 1e6:.2f} us" + (f", metric {b.metric:.4g}" if b.metric is not None else "") + "."]
    base = data.get("baseline") or {}
    if base.get("shapes"):
        out += ["", f"Baseline ({base.get('mode')}), as the run timed it: " + ", ".join(
            f"{d['median'] * 1e6:.1f} us ±{d.get('spread', 0):.0%}" for d in base["shapes"])
            + " (± the interquartile spread over the median)."]
    check = data.get("goal_check")
    if check:
        from ..ledger.summary import goal_check_line

        out += ["", (goal_check_line(data["spec"], check) if data["spec"] is not None
                     else f"Goal check: {json.dumps(check)}") + "."]
    split = time_split(data)
    if split:
        out += ["", split]
    cmp = data["compare"]
    if cmp:
        m = cmp.get("machine", {})
        out += ["", f"Per-shape figures from `pipe compare` on {m.get('device', '?')} (torch {m.get('torch', '?')}"
                + (f", triton {m['triton']}" if "triton" in m else "") + f"), {cmp.get('date', '')}."]
    cols = _columns(rows)
    out += ["", "| " + " | ".join(c[0] for c in cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_cell(r, k, kind).replace("|", "/") for _, k, kind in cols) + " |")
    crows = curve_rows(data)
    if crows:
        from .ranges import format_ranges

        out += ["", "Dispatch by range, as `pipe compare` measured it:", "", "```",
                format_ranges(cmp["range_table"]), "```", "",
                "The table against every arm at secret points of the domain (regret: the table's time over the "
                "best arm's, minus one; negative where the table is faster than every arm):", "",
                "| " + " | ".join(crows[0]) + " |", "|" + " --- |" * len(crows[0])]
        out += ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in crows]
    held = held_rows(data)
    if held:
        out += ["", "Held-out shapes (never tuned on): the dispatch table's choice against every kernel of the "
                "table compiled for the shape, and torch eager.", "",
                "| " + " | ".join(held[0]) + " |", "|" + " --- |" * len(held[0])]
        out += ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in held]
    if data["spec"] is None:
        out += ["", "The spec no longer matches the run (moved or changed): no floors or roofline."]
    note = roofline_note(data)
    if note:
        out += ["", note]
    return "\n".join(out) + "\n"


def html_page(data, rows) -> str:
    s = summary(data)
    imgs = [("Best so far", plot_progress(data)), ("Every trial", plot_status(data)),
            ("Speedups per shape", plot_speedups(data, rows)),
            ("Roofline" if not roofline_note(data) else "Achieved bandwidth", plot_roofline(data, rows)),
            ("Across the domain: the dispatch table against every arm", plot_curve(data))]
    cols = _columns(rows)
    table = "<table><tr>" + "".join(f"<th>{html.escape(c[0])}</th>" for c in cols) + "</tr>"
    for r in rows:
        table += "<tr>" + "".join(f"<td>{html.escape(_cell(r, k, kind))}</td>" for _, k, kind in cols) + "</tr>"
    table += "</table>"
    b = s["best"]
    head = (f"<p>{s['trials']} trials: " + ", ".join(f"{html.escape(k)} {v}" for k, v in sorted(s["by_status"].items()))
            + (f"; {s['per_min']:.0f} trials a minute of judge time" if s["per_min"] else "")
            + "; ledger chain " + ("intact" if s["intact"] else "<b>BROKEN</b>") + ".</p>")
    if data.get("agent"):
        head += f"<p>Agent: {html.escape(data['agent'])}.</p>"
    if data.get("compare_changed"):
        head += f"<p><b>pipe compare's figures are left out</b>: {html.escape(data['compare_changed'])}.</p>"
    if b:
        head += (f"<p>Best overall: trial #{b.id} <code>{html.escape(json.dumps(b.params))}</code>, "
                 f"geometric-mean time {b.objective * 1e6:.2f} us.</p>")
    split = time_split(data)
    if split:
        head += f"<p>{html.escape(split)}</p>"
    note = roofline_note(data)
    figs = "".join(f'<h2>{html.escape(t)}</h2>'
                   + (f"<p>{html.escape(note)}</p>" if note and t == "Achieved bandwidth" else "")
                   + f'<img alt="{html.escape(t)}" src="data:image/png;base64,{p}">'
                   for t, p in imgs if p)
    for title, rs in (("Across the domain: regret at secret points", curve_rows(data)),
                      ("Held-out shapes: the dispatch table where nobody tuned", held_rows(data))):
        if rs:
            table += (f"<h2>{html.escape(title)}</h2><table><tr>"
                      + "".join(f"<th>{html.escape(c)}</th>" for c in rs[0]) + "</tr>"
                      + "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>"
                                for r in rs) + "</table>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#212529}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #dee2e6;padding:4px 8px;"
             "text-align:left}th{background:#f1f3f5}img{max-width:100%}code{font-size:12px}")
    title = html.escape(f"{s['spec']}: run report")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{style}</style></head>"
            f"<body><h1>{title}</h1><p>Run folder <code>{html.escape(data['run'])}</code></p>{head}"
            f"<h2>Per shape: the kernel to use for each shape</h2>{table}{figs}</body></html>\n")


def write(run_dir: Path, out_dir: Path | None = None, spec_path: str | None = None,
          force: bool = False) -> tuple[Path, Path]:
    from ..ledger.ledger import write_atomic

    data = load(run_dir, spec_path, force)
    if not data["trials"]:
        from ..core.errors import RunDirError

        raise RunDirError(f"{run_dir}: the ledger holds no trials yet")
    rows = shape_rows(data)
    out = out_dir or run_dir
    out.mkdir(parents=True, exist_ok=True)
    h, m = out / "report.html", out / "report.md"
    write_atomic(h, html_page(data, rows))
    write_atomic(m, markdown(data, rows))
    return h, m
