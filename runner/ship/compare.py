"""`pipe compare RUN`: the tuned kernels against what a user would otherwise run.

For every spec shape, in one worker process on the device and one timing
protocol, side by side in rounds that alternate the order:

- the run's best candidates *for that shape* (the `top` fastest trials on it by
  their recorded times, plus the run's overall best); the fastest by this fresh
  measurement is the shape's winner, so a lucky recorded time cannot pick it;
- torch eager: the spec's reference, in the op's dtype;
- torch.compile of the same reference;
- a Triton kernel with `triton.autotune` (the spec's `op.triton`), written for
  the comparison;
- the spec's named arms (`op.arms`: name -> "module:function", say each SDPA
  backend, or a loop over experts), called like the reference; one that does not
  import or raises (a backend this device lacks) is reported unavailable, with why;
- the copy ceiling: a device copy moving the op's floor bytes (half read,
  half written), measured in the same run.

Every arm is checked against the float64 reference; a wrong arm is reported,
never ranked. The result is a table (TB/s, the fraction of the measured copy
and of the profile's limit, speedups) and a JSON document with the machine,
the versions and the date.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import shutil
from pathlib import Path

from ..core import figures
from ..core.errors import ExprError, PipeError
from ..build.render import RenderError
from ..core.figures import shape_label
from ..spec.spec import BUILTIN_ARMS

ARMS = BUILTIN_ARMS  # the built-in arms; op.arms adds named ones
# RUN/compare-parts: a range compare's worker requests, each kept as it ends, until compare.json
# is written; a compare cut short (a time limit, a kill) resumes from them (ranges.Prober)
PARTS = "compare-parts"


def arm_order(user: dict | None) -> list[str]:
    """The arms of a table, in order: torch eager, torch.compile, then the user's arms
    (op.triton as "triton", then op.arms), never the copy."""
    return ["torch eager", "torch.compile", *(user or {})]


def extra_arms(arm_dicts) -> list[str]:
    """The named arms (op.arms) among several {arm: figures} dicts, in first-seen order."""
    return list(dict.fromkeys(k for d in arm_dicts for k in d if k not in ARMS))


class CompareError(PipeError):
    pass


def compare_and_write(run_dir: Path, json_path: Path | None = None, spec_path: str | None = None, **kw) -> dict:
    """compare_run, its figures written to RUN/compare.json (and to `json_path`)."""
    from ..ledger.ledger import write_atomic

    doc = compare_run(run_dir, spec_path, **kw)
    text = json.dumps(doc, indent=2, default=str) + "\n"
    write_atomic(run_dir / "compare.json", text)
    record_compare(run_dir, text.encode("utf-8"), doc.get("spec_hash"))
    # the figures are written: the next compare of this run times everything afresh
    shutil.rmtree(run_dir / PARTS, ignore_errors=True)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(json_path, text)
    return doc


def record_compare(run_dir: Path, data: bytes, spec_hash: str | None) -> dict:
    """The sha256 of the compare.json just written (its bytes), recorded in the run's ledger
    (Ledger.add_compare): export and report take compare.json's verdicts (the range table,
    each shape's pick, the held-out ships) only where its bytes still hash to the last record."""
    import hashlib
    import sqlite3

    from ..ledger.ledger import Ledger

    try:
        led = Ledger(run_dir / "ledger.db")
        try:
            return led.add_compare(hashlib.sha256(data).hexdigest(), spec_hash or "")
        finally:
            led.close()
    except sqlite3.DatabaseError as e:  # unrecorded: moved aside, where export and report do not read it
        (run_dir / "compare.json").replace(run_dir / "compare.unrecorded.json")
        raise CompareError(f"{run_dir / 'ledger.db'}: cannot record the digest of the compare.json written ({e}): "
                           "it is kept as compare.unrecorded.json, which export does not take") from None


def candidates(history, n_shapes: int, top: int) -> list[list]:
    """Per shape: the `top` fastest ok trials on that shape, then the overall best if missing."""
    ok = [t for t in history if t.status == "ok" and t.times]
    kept = [t for t in history if t.kept]
    out = []
    for i in range(n_shapes):
        ranked = sorted(ok, key=lambda t: t.times[i])[:top]
        if kept and kept[-1] not in ranked:
            ranked.append(kept[-1])
        out.append(ranked)
    return out


def compare_run(run_dir: Path, spec_path: str | None = None, top: int = 3, rounds: int = 4,
                torch_compile: bool = True, triton: bool = True, timeout_s: float = 3600,
                force: bool = False, points: int | None = None, arms: bool = True, progress=None,
                verify: int | None = None) -> dict:
    """`triton`, `arms`: whether op.triton and op.arms (every named arm) are compared.
    `verify`: with op.domain, the sizes each kernel of the range table is verified at over each
    of its ranges (ranges.verify_table; judge/domain.SWEEP by default).
    `progress`: called with a line of text as each stage starts and each timing request ends
    (the CLI prints them on stderr: a range compare runs for minutes)."""
    from ..judge.worker import Worker
    from .rundata import open_run
    from ..build.builder import Builder

    if top < 1 or rounds < 2:
        raise CompareError(f"--top must be at least 1 and --rounds at least 2 (got {top} and {rounds})")
    rd = open_run(run_dir, spec_path, "compare times", read_compare=False, force=force)
    spec, history, variants = rd.spec, rd.history, rd.variants
    base = rd.baseline
    if spec.hw.kind == "cuda":  # at once, before any build or worker (the run and eval commands' check)
        import torch

        if not torch.cuda.is_available():
            raise CompareError(f"profile '{spec.hw.name}' needs a CUDA GPU and none is available: compare "
                               "times the run's kernels on the GPU they were tuned for")
    if spec.op.domain:
        return compare_range(spec, run_dir, history, variants, base, top, rounds, timeout_s, points=points,
                             torch_compile=torch_compile, triton=triton, arms=arms, progress=progress,
                             verify=verify)
    n = len(spec.op.shapes)
    cands = candidates(history, n, top)
    if not any(cands):
        raise CompareError(f"{run_dir}: no correct trial to compare")
    builder = Builder(spec)
    builder.variants = variants
    built: dict[int, tuple[list[str], list[dict]]] = {}
    for t in {t.id: t for row in cands for t in row}.values():
        arts, bad = builder.compiled(builder.render_all(t.params, t.variant))
        if bad is not None:
            raise CompareError(f"trial #{t.id} no longer compiles: {bad.reason}")
        built[t.id] = (arts, builder.geometry(t.params))
    user = spec.op.compare_arms(triton, arms)
    job = {"seed": secrets.randbits(48), "rounds": rounds, "eager": True, "compile": torch_compile,
           "arms": user,
           "candidates": [[{"label": f"#{t.id}", "trial": t.id, "artifact": built[t.id][0][i],
                            "geometry": built[t.id][1][i]} for t in row] for i, row in enumerate(cands)]}
    worker = Worker(spec, str(run_dir / "compare-worker.log"))
    try:
        if progress:
            progress(f"timing {sum(map(len, cands))} kernel timings at {n} shapes beside torch eager"
                     + (", torch.compile" if torch_compile else "") + "".join(f", {a}" for a in user))
        r = worker.request(("compare", job), timeout_s)
        if r.get("status") != "ok":
            raise CompareError(f"the comparison failed ({r.get('status')}): {r.get('reason', '')}")
        doc = _figures(spec, run_dir, history, cands, r, base, user)
        if spec.op.held_out_shapes:  # a failure there keeps the figures above and says why
            if progress:
                progress(f"the dispatch table on {len(spec.op.held_out_shapes)} held-out shapes")
            try:
                doc["held_out"] = _held_out(spec, builder, history, doc, base, worker, rounds, timeout_s)
            except (CompareError, RenderError, ExprError) as e:
                doc["held_out_error"] = str(e)
    finally:
        worker.close()
    return doc


def compare_range(spec, run_dir: Path, history, variants, base, top: int, rounds: int, timeout_s: float,
                  seed: int | None = None, points: int | None = None, torch_compile: bool = True,
                  triton: bool = True, arms: bool = True, progress=None, verify: int | None = None) -> dict:
    """pipe compare of a spec with op.domain: the range table measured, its kernels verified over
    their ranges, then its curve at secret points (runner/ship/ranges.py). `progress` as
    compare_run's."""
    from ..judge.worker import Worker
    from ..build.builder import Builder
    from . import ranges

    if not any(t.status == "ok" and t.times for t in history):
        raise CompareError(f"{run_dir}: no correct trial to compare")
    builder = Builder(spec)
    builder.variants = variants
    worker = Worker(spec, str(run_dir / "compare-worker.log"))
    by_id = {t.id: t for t in history}
    seed = secrets.randbits(48) if seed is None else seed
    try:
        prober = ranges.Prober(spec, builder, worker, by_id, rounds, timeout_s)
        prober.log = progress
        prober.parts_dir = run_dir / PARTS  # a compare cut short resumes from its finished parts
        prober.ledger_path = run_dir / "ledger.db"  # ... where the ledger recorded each one's sha256
        user = spec.op.compare_arms(triton, arms)
        prober.arms = {"compile": torch_compile, "arms": user}
        n = points or ranges.CURVE_POINTS
        prober.warm = {**prober.arms, "shapes": ranges.secret_points(spec, seed, n)}
        if progress:
            warms = ["torch.compile"] * torch_compile + list(user)
            progress(f"{spec.name}: the range table from {sum(t.status == 'ok' for t in history)} correct trials"
                     + (f" (the first timing request also warms {', '.join(warms)})" if warms else ""))
        table = ranges.build(spec, history, prober, top=top, log=progress)
        # a kernel wrong at any size of a range it is listed for leaves the table before the curve
        ranges.verify_table(spec, table, prober, secrets.randbits(48), verify, log=progress)
        if progress:
            progress(f"the curve: the table at {n} secret points against every arm")
        rows = ranges.curve(spec, table, prober, seed, n)
        for tid in ranges.drop_wrong_at_curve(table, rows):
            if progress:
                progress(f"#{tid} was wrong at a secret point of the curve: dropped from the table")
        for tid, span in ranges.cut_slow_at_curve(table, rows, ranges.confirmer(spec, table, prober)):
            if progress:
                progress(f"#{tid} was slower than the table's fallback at a secret point and at most of "
                         f"{ranges.CONFIRM} more: {span} takes the fallback")
    finally:
        worker.close()
    resumed = None
    if prober.reused:
        dates = sorted(p["date"] or "" for p in prober.reused)
        resumed = {"parts": len(prober.reused), "shapes": sum(p["shapes"] for p in prober.reused),
                   "first": dates[0], "last": dates[-1]}
    return {"format": "pipe-compare/1", "run": str(run_dir), "spec": spec.name, "spec_path": spec.path,
            "spec_hash": spec.hash, "hardware": spec.hw.name, "machine": getattr(prober, "machine", {}),
            **({"resumed": resumed} if resumed else {}),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "protocol": {"cache": spec.runtime.cache, "mode": spec.runtime.mode,
                         "warmup_ms": spec.runtime.warmup_ms, "rep_ms": spec.runtime.rep_ms, "rounds": rounds,
                         "inputs": compared_inputs(spec),
                         "torch.compile": "dynamic=True" if torch_compile else "left out", "arms": user},
            "recorded_baseline": base, "range_table": table, "curve": rows, "shapes": []}


def _held_out(spec, builder, history, doc: dict, base, worker, rounds: int, timeout_s: float) -> list[dict]:
    """The dispatch table on shapes nobody tuned on: its choice there (a shipped kernel
    by the table's rule, or the torch reference) against every kernel of the table
    compiled for that shape and against torch eager; the regret is the choice's time over
    the best of them, minus one."""
    from .export import NOISE, baked_symbols, choose, dispatch_table, nearest_all, table_entry

    table = dispatch_table(spec, history, doc, base)
    baked = baked_symbols(spec)
    entries = [table_entry(shape, row, baked) for shape, row in zip(spec.op.shapes, table)]
    by_id = {t.id: t for t in history}
    kernels = sorted({row["trial"] for row in table if row["use"] == "kernel"})
    held = list(spec.op.held_out_shapes)
    job = {"seed": secrets.randbits(48), "rounds": rounds, "eager": True, "compile": False,
           "copy": False, "shapes": held, "candidates": []}
    for shape in held:
        row = []
        skipped = {}
        for tid in kernels:
            t = by_id[tid]
            src = builder.render_all(t.params, t.variant, shapes=[shape])[0]
            geo = builder.geometry(t.params, shapes=[shape])[0]
            b = builder.build([src], [geo])  # the checks a trial's sources pass
            if b.status != "ok":  # this kernel cannot run on this shape: neither a choice nor a rival there
                skipped[f"#{tid}"] = f"{b.status}: {b.reason}"
                continue
            row.append({"label": f"#{tid}", "trial": tid, "artifact": b.artifacts[0], "geometry": geo})
        job["candidates"].append(row)
        job.setdefault("skipped", []).append(skipped)
    r = worker.request(("compare", job), timeout_s)
    if r.get("status") != "ok":
        raise CompareError(f"the held-out comparison failed ({r.get('status')}): {r.get('reason', '')}")
    out = []
    symbols = list(spec.op.symbols)
    for shape, f, res in zip(held, figures.floors(spec, held), r["shapes"]):
        times = {k: v["median"] for k, v in res.items() if v.get("error") is None and v.get("median")}
        errors = {k: v["error"] for k, v in res.items() if v.get("error")}
        errors.update(job["skipped"][len(out)])
        # The table's rule: a kernel tuned for the same compiled-in sizes; else the nearest tuned
        # kernel (of equally near ones, the faster here) compiled for this shape, which pipe export
        # ships only where it beat torch eager here by more than the noise margin; else torch eager.
        e = choose(entries, baked, symbols, shape)
        untuned = e is None
        near: list[str] = []
        decided: dict[str, float] = {}
        if e is not None:
            choice = f"#{e['trial']}" if e["use"] == "kernel" else "torch eager"
            via = "tuned sizes" if e["use"] == "kernel" else "tuned sizes: fallback"
        else:
            # decided on the even rounds, like the tuned shapes' winners (the times shown are all rounds')
            pick = {k: _split(v["rounds"])[0] for k, v in res.items() if v.get("error") is None and v.get("rounds")}
            tied = nearest_all(entries, baked, symbols, shape)
            near = [f"#{x['trial']}" for x in tied]
            e = faster_nearest(tied, pick)
            label = f"#{e['trial']}" if e is not None else None
            eager = pick.get("torch eager")
            if label and eager and pick.get(label):  # the figures the decision is made on
                decided = {label: pick[label], "torch eager": eager}
            if decided and label in times and decided[label] < eager * (1 - NOISE):
                sizes = " or ".join(shape_label(x["shape"]) for x in tied)
                choice, via = label, f"nearest tuned sizes ({sizes}{', the faster here' if len(tied) > 1 else ''}), " \
                                     "checked here"
            else:
                choice, via = "torch eager", "no tuned sizes" + (f"; nearest {label} not faster here" if label else "")
        best = min(times, key=times.get) if times else None
        row = {"shape": dict(shape), "label": shape_label(shape), "bytes": f["bytes"], "choice": choice,
               "via": via, "choice_s": times.get(choice), "best": best,
               "best_s": times.get(best) if best else None, "times_s": times, "errors": errors}
        if near:
            row["nearest"] = near
        if decided:  # even rounds' medians; times_s are all rounds', so they may rank otherwise
            row["decided_s"] = decided
        if untuned and choice != "torch eager":
            # the figures that did not pick it (odd rounds), like the tuned shapes' reported times
            row["ship"] = {"trial": e["trial"], "params": by_id[e["trial"]].params,
                           "variant": by_id[e["trial"]].variant,
                           "time_s": _split(res[choice]["rounds"])[1] or times[choice],
                           "baseline_s": _split(res["torch eager"]["rounds"])[1] or times.get("torch eager")}
        if untuned:  # one decision per compiled-in size (_one_choice_per_size)
            row["key"] = [shape[s] for s in baked]
        out.append(row)
    _verify_ships(spec, builder, worker, out, baked, timeout_s)
    _one_choice_per_size(out)
    for row in out:
        row.pop("key", None)
        row["regret"] = (row["choice_s"] / row["best_s"] - 1) if row["choice_s"] and row["best_s"] else None
    return out


def faster_nearest(tied: list[dict], pick: dict[str, float]) -> dict | None:
    """Of equally near tuned entries, the one timed faster on the held-out shape (`pick`:
    label -> even rounds' median); the first where none of them ran there."""
    if not tied:
        return None
    return min(tied, key=lambda x: pick.get(f"#{x['trial']}", float("inf")))


def _unship(row: dict, why: str) -> None:
    row.pop("ship", None)
    row["choice"], row["choice_s"] = "torch eager", row["times_s"].get("torch eager")
    row["via"] = why


def _verify_ships(spec, builder, worker, rows: list[dict], baked: list[str], timeout_s: float) -> None:
    """A kernel about to be shipped for a size nobody tuned passes the trial's verification
    first: on the held-out shape and on the same sizes with few rows (a partial tile), every
    input distribution of the spec, both poisons. One that fails is not shipped."""
    ndist = max((len(t.dists) for t in spec.op.inputs), default=1)
    for row in rows:
        sh = row.get("ship")
        if not sh:
            continue
        shape = row["shape"]
        small = {k: (min(v, 3) if k not in baked else v) for k, v in shape.items()}
        shapes = [shape] + ([small] if small != shape else [])
        srcs = builder.render_all(sh["params"], sh["variant"], shapes=shapes)
        geos = builder.geometry(sh["params"], shapes=shapes)
        b = builder.build(srcs, geos)
        if b.status != "ok":
            _unship(row, f"nearest #{sh['trial']} {b.status}: {b.reason}"[:300])
            continue
        job = {"seed": secrets.randbits(48), "artifacts": b.artifacts, "geometry": geos, "shapes": shapes,
               "n_timed": 0, "checks": max(spec.runtime.checks, ndist)}
        approved, why = builder.approved_artifacts(sh["params"], sh["variant"], shapes)
        if why:
            _unship(row, f"nearest #{sh['trial']}: unjudged_precision: {why}"[:300])
            continue
        if approved is not None:  # a variant's error held to the approved build's (worker evaluate)
            job["approved"] = approved
        r = worker.request(("evaluate", job), timeout_s)
        if r.get("status") != "ok":
            _unship(row, f"nearest #{sh['trial']} failed verification: {r.get('status')}: "
                         f"{r.get('reason', '')}"[:300])
        else:
            row["via"] += f"; verified on {' and '.join(shape_label(x) for x in shapes)}"


def _one_choice_per_size(rows: list[dict]) -> None:
    """The table holds one kernel per compiled-in size, used for every number of rows: several
    held-out shapes of one size ship it only if the same kernel was faster, and verified, on
    each of them; otherwise none of them does."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "key" in row:
            groups.setdefault(tuple(row["key"]), []).append(row)
    for group in groups.values():
        trials = {(r.get("ship") or {}).get("trial") for r in group}
        if len(group) > 1 and (None in trials or len(trials) > 1):
            for r in group:
                _unship(r, "not the same nearest kernel faster and verified on every held-out shape of these sizes")


def _clock_lines(shapes: list[dict]) -> list[str]:
    """A line per shape where the tuned kernel or an arm ran below full clock (judge/clocks.py):
    each one's SM clock, its low, the power's high and NVML's reasons, over its rounds."""
    from ..judge.clocks import notes

    def tuned(s):
        t = (s.get("tuned") or {}).get("trial")
        return (s["candidates"].get(t) or s["candidates"].get(str(t)) or {}).get("clock")
    return notes([(s["label"], [("tuned", tuned(s)), *((n, a.get("clock")) for n, a in s["arms"].items())])
                  for s in shapes],
                 "below full clock (SM clock median, its low, the power's high and NVML's reasons over the "
                 "timed rounds):")


def _figures(spec, run_dir: Path, history, cands, r: dict, baseline, user: dict | None = None) -> dict:
    import statistics

    fl = figures.floors(spec)
    by_id = {t.id: t for t in history}
    shapes = []
    for i, (shape, res) in enumerate(zip(spec.op.shapes, r["shapes"])):
        f = fl[i]
        row = {"shape": shape, "label": shape_label(shape), "bytes": f["bytes"], "floor_s": f["floor"],
               "candidates": {}, "arms": {}}
        best = None
        for t in cands[i]:
            d = res.get(f"#{t.id}")
            if d is None:
                continue
            pick, report = _split(d["rounds"])
            row["candidates"][t.id] = {"params": t.params, "variant": t.variant, "time_s": report,
                                       **({"batch_invariant": t.details.get("batch_invariant")}
                                          if spec.op.batch_axis else {}),
                                       "pick_s": pick, "rounds_s": d["rounds"], "recorded_s": t.times[i],
                                       "error": d["error"], "mode": d.get("mode"),
                                       **({"clock": d["clock"]} if d.get("clock") else {})}
            if d["error"] is None and pick and (best is None or pick < best[1]):
                best = (t.id, pick)
        if best is not None:  # the winner's reported time comes from rounds that did not pick it
            best = (best[0], row["candidates"][best[0]]["time_s"])
        copy_s = (res.get("copy") or {}).get("median")
        row["copy_s"] = copy_s
        row["copy_bytes_per_s"] = f["bytes"] / copy_s if copy_s else None
        if best:
            tid, ts = best
            row["tuned"] = {"trial": tid, "params": by_id[tid].params, "variant": by_id[tid].variant,
                            **({"batch_invariant": by_id[tid].details.get("batch_invariant")}
                               if spec.op.batch_axis else {}),
                            **_rates(f, ts, copy_s)}
        else:
            row["tuned"] = None
        for arm in arm_order(user):
            d = res.get(arm)
            if d is None:
                continue
            a = {"error": d["error"], **({"mode": d["mode"]} if d.get("mode") else {}),
                 **({"note": d["note"]} if d.get("note") else {}),
                 **({"clock": d["clock"]} if d.get("clock") else {})}
            if d["median"]:
                a.update(_rates(f, d["median"], copy_s))
                if best and d["error"] is None:
                    # the arm's time over the tuned kernel's, round by round (the two ran back to
                    # back in each round): the median of those ratios, and the lowest and highest
                    # (a ratio of two medians over different rounds could fall outside that range)
                    ratios = [x / y for x, y in zip(d.get("rounds") or [], row["candidates"][best[0]]["rounds_s"])
                              if x and y]
                    if ratios:
                        a["tuned_speedup"] = statistics.median(ratios)
                        a["tuned_speedup_range"] = [min(ratios), max(ratios)]
                    else:
                        a["tuned_speedup"] = d["median"] / best[1]
            row["arms"][arm] = a
        shapes.append(row)
    return {"format": "pipe-compare/1", "run": str(run_dir), "spec": spec.name, "spec_path": spec.path,
            "spec_hash": spec.hash, "hardware": spec.hw.name, "machine": r.get("machine", {}),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "protocol": {"cache": spec.runtime.cache, "mode": spec.runtime.mode,
                         "warmup_ms": spec.runtime.warmup_ms, "rep_ms": spec.runtime.rep_ms,
                         "inputs": compared_inputs(spec), "arms": dict(user or {})},
            **({"batch_axis": spec.op.batch_axis} if spec.op.batch_axis else {}),
            "recorded_baseline": baseline, "shapes": shapes}


def compared_inputs(spec) -> dict[str, list[str]]:
    """The input distributions every arm of pipe compare is timed on: the worker's rotation
    alternates the values of rounds 0 and 1 (`Judge._rotation`), the timed calls' values (an
    input's `timed` override, its bounds shown: "randint [L, L + 1)"). Torch eager softmax, for
    one, runs twice as long on "outliers" as on "normal" values (notebook/kernels.md), and
    a run's own baseline is timed on round 0's alone."""
    out = {}
    for t in spec.op.inputs:
        v = t.drawn(timed=True)
        names = [v.dists[r % len(v.dists)] for r in (0, 1)]
        if v is not t:
            names = [f"{d} [{v.low.text}, {v.high.text})" if d == "randint" else d for d in names]
        out[t.name] = list(dict.fromkeys(names))
    return out


def _split(rounds: list[float]) -> tuple[float | None, float | None]:
    """Medians of the even rounds (to pick the winner among a shape's candidates) and of the
    odd rounds (to report its time): picking the minimum of noisy figures and reporting that
    same minimum would flatter the tuned kernel."""
    import statistics

    if not rounds:
        return None, None
    pick = statistics.median(rounds[0::2])
    return pick, (statistics.median(rounds[1::2]) if len(rounds) > 1 else pick)


def _rates(f: dict, t: float, copy_s: float | None) -> dict:
    return {"time_s": t, "bytes_per_s": f["bytes"] / t, "limit_fraction": f["floor"] / t,
            "copy_fraction": (copy_s / t) if copy_s else None}


def format_table(doc: dict) -> str:
    if "range_table" in doc:
        from .ranges import format_curve, format_ranges

        m = doc.get("machine", {})
        t = doc["range_table"]
        return (f"{doc['spec']} on {m.get('device', '?')} (torch {m.get('torch', '?')}), {doc['date']}\n"
                f"dispatch by range (built from {t['probes']} timing requests; the check and the curve take "
                f"more):\n{format_ranges(t)}\n\n"
                f"at {len(doc['curve'])} secret points of the domain:\n"
                + format_curve(doc["curve"], t["axes"]))
    m = doc.get("machine", {})
    head = (f"{doc['spec']} on {m.get('device', '?')} (torch {m.get('torch', '?')}"
            + (f", triton {m['triton']}" if "triton" in m else "") + f"), {doc['date']}")
    named = extra_arms(s["arms"] for s in doc["shapes"])  # op.arms: a column each, after triton
    cols = ["shape", "tuned", "TB/s", "of copy", "eager", "compile", "triton", *named, "copy TB/s", "trial"]
    rows = []
    for s in doc["shapes"]:
        t = s["tuned"]
        cells = [s["label"]]
        if t:
            cells += [f"{t['time_s'] * 1e6:.1f} us", f"{t['bytes_per_s'] / 1e12:.2f}",
                      f"{t['copy_fraction']:.3f}" if t["copy_fraction"] else "-"]
        else:
            cells += ["wrong", "-", "-"]
        for arm in [*ARMS[:3], *named]:
            a = s["arms"].get(arm)
            if a is None:
                cells.append("-")
            elif a.get("error"):
                # unavailable: it did not import or raised on its first call (its reason is below)
                cells.append("n/a" if a["error"].startswith("unavailable") else "wrong")
            else:
                sp, rg = a.get("tuned_speedup"), a.get("tuned_speedup_range")
                cells.append(f"{a['time_s'] * 1e6:.1f} us" + (
                    f" ({sp:.2f}x, {rg[0]:.2f}-{rg[1]:.2f})" if sp and rg else f" ({sp:.2f}x)" if sp else ""))
        cells.append(f"{s['copy_bytes_per_s'] / 1e12:.2f}" if s.get("copy_bytes_per_s") else "-")
        cells.append(f"#{t['trial']}" if t else "-")
        rows.append(cells)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("(x, lo-hi): how many times slower than the tuned kernel, and the lowest and highest of that "
                 "ratio over the paired rounds; 'of copy': the copy's time over the tuned kernel's for the same bytes")
    lines.append("times: the tuned kernel's median over the rounds that did not pick it, an arm's over all its "
                 "rounds; a ratio is the median of the rounds' own ratios (each round times the two back to back), so "
                 "on a noisy machine it need not be the quotient of the two times shown")
    if doc.get("batch_axis"):  # op.batch_invariant: each shape's winner, by the judge's check
        from .ranges import invariance_line

        lines.append(invariance_line(doc["batch_axis"], {str(s["tuned"]["trial"]): s["tuned"].get("batch_invariant")
                                                         for s in doc["shapes"] if s.get("tuned")}).strip())
    ins = (doc.get("protocol") or {}).get("inputs")
    if ins:
        lines.append("inputs, alternating before every timed call: "
                     + "; ".join(f"{k} {' and '.join(v)}" for k, v in ins.items()))
    if doc.get("held_out_error"):
        lines.append(f"held-out shapes: not compared: {doc['held_out_error']}")
    if doc.get("held_out"):
        lines.append("held-out shapes (never tuned on): the dispatch table's choice against every kernel of the "
                     "table compiled for the shape, and torch eager")
        for h in doc["held_out"]:
            ch = f"{h['choice_s'] * 1e6:.1f} us" if h["choice_s"] else "wrong"
            bs = f"{h['best_s'] * 1e6:.1f} us" if h["best_s"] else "-"
            rg = f"regret {h['regret']:.1%}" if h["regret"] is not None else "regret -"
            lines.append(f"  {h['label']}: table -> {h['choice']} {ch} ({h.get('via', '')}); best {h['best']} {bs}; {rg}")
            for k, why in h["errors"].items():
                lines.append(f"    {k}: {why}")
    lines += _clock_lines(doc["shapes"])
    for s in doc["shapes"]:
        for arm, a in s["arms"].items():
            if a.get("error"):
                lines.append(f"{s['label']} {arm}: {a['error']}")
            elif a.get("note"):
                lines.append(f"{s['label']} {arm}: {a['note']}")
        for tid, c in s["candidates"].items():
            if c.get("error"):
                lines.append(f"{s['label']} trial #{tid}: {c['error']}")
    return "\n".join(lines)
