"""pipe's command line.

    pipe run SPEC [--run-dir DIR] [--max-trials N] [--minutes M]
    pipe validate SPEC...
    pipe render SPEC --set NAME=VALUE... [--shape I|extra:I|held:I] [--compile]
    pipe runs [--root DIR]
    pipe show RUN [--json]
    pipe report RUN [--out DIR]
    pipe export RUN [--out DIR] [--name NAME]
    pipe compare RUN [--json PATH] [--top K] [--rounds R] [--no-compile] [--no-triton] [--no-arms]
    pipe merge A.json B.json [C.json ...] --out OUT.json

Exit codes: 0 goal met (or command succeeded), 1 budget spent without
meeting the goal (the best is still saved; pipe show: the ledger is broken),
2 invalid input (a busy run folder, a broken ledger without --force).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

from . import __version__
from .core.errors import PipeError, SpecError

EXIT_OK, EXIT_BUDGET, EXIT_INPUT = 0, 1, 2


def _load(path: str):
    from .spec.spec import load_spec

    return load_spec(path)


def cmd_validate(a) -> int:
    bad = 0
    for p in a.specs:
        try:
            s = _load(p)
            print(f"{p}: ok ({s.name}: {len(s.op.shapes)} shapes, {len(s.space.params)} parameters, "
                  f"space of {s.space.size} before constraints)")
        except SpecError as e:
            bad += 1
            print(str(e), file=sys.stderr)
    return EXIT_INPUT if bad else EXIT_OK


def cmd_hw(a) -> int:
    from .spec import measure

    if a.reps < 2:
        raise PipeError(f"--reps {a.reps}: at least 2 timed calls a figure, for its quartiles")
    if a.json:
        writable(Path(a.json))
    got = measure.measure(a.reps, a.profile)
    print(measure.report(got))
    if a.json:
        Path(a.json).write_text(json.dumps(got, indent=2, default=str) + "\n")
    return EXIT_OK


def cmd_render(a) -> int:
    from .build import render
    from .spec.spec import parse_value

    spec = _load(a.spec)
    given = {}
    for item in a.set or []:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            print(f"--set {item}: expected NAME=VALUE", file=sys.stderr)
            return EXIT_INPUT
        given[name.strip()] = parse_value(value.strip())
    if spec.start:
        params = {**spec.start, **given}
    else:  # a spec with no search.start: the space's first configuration that has the values given
        params = next((dict(c) for c in spec.space if all(c.get(k) == v for k, v in given.items())), None)
        params = params or {**dict(next(iter(spec.space), {})), **given}  # (none has them: contains says why)
    why = spec.space.contains(params)
    if why:
        print(f"{a.spec}: these parameters are not a point of the space: {why}", file=sys.stderr)
        return EXIT_INPUT
    variant = None
    if a.variant:
        try:
            variant = Path(a.variant).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            print(f"--variant {a.variant}: {e.strerror if isinstance(e, OSError) else 'not UTF-8 text'}",
                  file=sys.stderr)
            return EXIT_INPUT
    try:
        label, source = render.render_shape(spec, params, a.shape, variant)
    except (render.RenderError, PipeError) as e:  # PipeError: ExprError from a derived value
        print(str(e), file=sys.stderr)
        return EXIT_INPUT
    if not a.compile:
        sys.stdout.write(source)
        return EXIT_OK
    try:
        ok, message = render.compile_check(spec, source, label, params, render.pick_shape(spec.op, a.shape)[1],
                                           variant)
    except PipeError as e:  # ExprError from the launch's sizes at this shape
        print(str(e), file=sys.stderr)
        return EXIT_INPUT
    print(message, file=sys.stdout if ok else sys.stderr)
    return EXIT_OK if ok else EXIT_BUDGET


def _check_free(a, suffix: str = "") -> None:
    """A busy run folder is refused at once, before the spec's load imports torch."""
    from .loop import check_free

    check_free(a.run_dir, a.spec, suffix)


def _positive(a) -> str | None:
    for flag, v in (("--max-trials", getattr(a, "max_trials", None)), ("--minutes", getattr(a, "minutes", None))):
        if v is not None and not 0 < v < float("inf"):  # (nan is no budget: every comparison with it is false)
            return f"{flag} must be a positive number, got {v:g}"
    return None


def _scale(a, spec) -> dict | None:
    """--workers, --gpus, --ray: the judge workers of a scaled-out run (runner.scale), checked
    before the run folder is touched; None for the one worker of a plain run."""
    if a.workers is None and a.gpus is None and a.ray is None:
        return None
    from .loop import check_scale

    check_scale(spec, a.workers, a.gpus, a.ray)
    return {"workers": a.workers, "gpus": a.gpus, "ray": a.ray, "hw_check": not a.no_hw_check}


def cmd_run(a) -> int:
    from . import loop
    from .progress import Reporter

    bad = _positive(a)
    if bad:
        print(f"pipe run: {bad}", file=sys.stderr)
        return EXIT_INPUT
    _check_free(a)
    spec = _load_only(a)
    if spec is None:
        return EXIT_INPUT
    if a.only:
        if not spec.starts:
            # the agents begin at a start configuration: the subspace needs one of its own
            spec = _start_inside(spec)
        n = sum(1 for _ in spec.space)
        if n == 0:
            print(f"pipe run: --only {' '.join(a.only)} leaves no configuration that meets the spec's constraints",
                  file=sys.stderr)
            return EXIT_INPUT
        print(f"searching the subspace {'; '.join(a.only)}: {n} configurations")
    scale = _scale(a, spec)
    if a.ray is None:  # (on a cluster the GPUs are the actors')
        loop.check_hardware(spec, match=not a.no_hw_check)
    run_dir = Path(a.run_dir) if a.run_dir else Path("runs") / spec.name
    total = a.max_trials or spec.goal.trials
    out = loop.run(spec, run_dir, a.max_trials, a.minutes, Reporter(total, quiet=a.quiet), force=a.force,
                   scale=scale)
    b = out.best
    if b is not None:
        from .progress import fmt_params, fmt_time

        ms = (b.details or {}).get("metric_spread")
        by = out.goal_by()
        print(f"{out.stop}: {_trials(out.trials)}; best #{b.id} {fmt_params(b.params)} "
              f"{fmt_time(b.objective)}" + (f", metric {b.metric:.4g}" if b.metric is not None else "")
              + (f" ±{ms:.0%}" if b.metric is not None and ms is not None else "")
              + (f"; {by}" if by else "") + f"; run folder {run_dir}")
        if out.goal_check is not None and not out.goal_check_shown:  # (else the progress printed it)
            print(loop.goal_check_line(spec, out.goal_check))
    else:
        print(f"{out.stop}: {_trials(out.trials)}; no correct kernel yet; run folder {run_dir}")
    return out.exit_code


def _load_only(a):
    """The spec of `a.spec`, cut to the subspace of `a.only` (NAME=V1,V2 items) where given;
    None after printing why an item is refused."""
    from .spec.spec import restrict

    spec = _load(a.spec)
    if not a.only:
        return spec
    try:
        return restrict(spec, a.only)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return None


def _start_inside(spec):
    """The spec with the first configuration of its (restricted) space as its start, where the
    spec's own starts all lie outside it."""
    import dataclasses

    first = next(iter(spec.space), None)
    return dataclasses.replace(spec, start=first, starts=(first,) if first else ())


def cmd_eval(a) -> int:
    """Judge one candidate with the full judge and append it to the run's ledger."""
    from . import loop

    _check_free(a)
    spec = _load(a.spec)
    try:
        params = json.loads(a.params)
    except json.JSONDecodeError as e:
        print(f"--params: not JSON: {e}", file=sys.stderr)
        return EXIT_INPUT
    if not isinstance(params, dict):
        print("--params: expected a JSON object of parameter values", file=sys.stderr)
        return EXIT_INPUT
    params = {**(spec.start or {}), **params}
    why = spec.space.contains(params)
    if why:
        print(f"--params: not a point of the space of {a.spec}: {why}", file=sys.stderr)
        return EXIT_INPUT
    variant = None
    if a.variant:
        try:
            variant = Path(a.variant).read_text(encoding="utf-8")
        except OSError as e:
            print(f"--variant: cannot read {a.variant}: {e.strerror}", file=sys.stderr)
            return EXIT_INPUT
        except UnicodeDecodeError as e:
            print(f"--variant: cannot read {a.variant}: not UTF-8 text (byte {e.start})", file=sys.stderr)
            return EXIT_INPUT
    loop.check_hardware(spec, match=not a.no_hw_check)
    run_dir = Path(a.run_dir) if a.run_dir else Path("runs") / spec.name
    t, old = loop.eval_one(spec, run_dir, params, variant, a.force)
    verdict = {"trial": t.id, "already_judged": old, "status": t.status, "reason": t.reason,
               "params": t.params, "variant": t.variant, "kept": t.kept, "objective_s": t.objective,
               "metric": t.metric, "shapes": t.details.get("shapes"), "run_dir": str(run_dir)}
    if a.json:
        print(json.dumps(verdict, indent=2, default=str))
    else:
        from .progress import fmt_params, fmt_time

        head = f"trial #{t.id}" + (" (judged before)" if old else "") + f": {t.status}"
        print(head + (f" ({t.reason})" if t.reason else "") + f"  {fmt_params(t.params)}"
              + (f"  variant {t.variant}" if t.variant else ""))
        for i, d in enumerate(t.details.get("shapes") or []):
            line = f"  shape {i}: {fmt_time(d['time_s'])}, {d['bytes_per_s'] / 1e9:.1f} GB/s, " \
                   f"{d['limit_fraction']:.3f} of the limit"
            print(line + (f", {d['speedup']:.2f}x the baseline" if "speedup" in d else ""))
        if t.status == "ok":
            print(f"  {'kept as the new best' if t.kept else 'not kept (the best is faster or the same)'}")
    return EXIT_OK if t.status == "ok" else EXIT_BUDGET


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be."""


_MADE: list[Path] = []  # folders `writable` made for an output, outermost first


def _unmake() -> None:
    """A refused or failed command leaves no empty folder it made for its output."""
    for p in reversed(_MADE):
        try:
            p.rmdir()  # only if empty
        except OSError:
            pass
    _MADE.clear()


def writable(path: Path, folder: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written: the file `path` (its folder
    made if missing), or with `folder` the folder itself. A PipeError (exit 2) names it."""
    import os
    import tempfile

    where = path if folder else path.parent
    missing = [p for p in (where, *where.parents) if not p.exists()]
    try:
        where.mkdir(parents=True, exist_ok=True)
        _MADE.extend(reversed(missing))  # removed again, if still empty, when the command fails
        fd, probe = tempfile.mkstemp(prefix=".pipe-probe-", dir=where)
        os.close(fd)
        os.unlink(probe)
        if not folder and path.is_dir():
            raise IsADirectoryError(21, "a folder is there")
    except OSError as e:
        raise PipeError(f"cannot write {path}: {e.strerror or e}") from None


def _trials(n: int) -> str:
    return f"{n} trial" + ("" if n == 1 else "s")


def cmd_record(a) -> int:
    from . import loop

    bad = _positive(a)
    if bad:
        print(f"pipe record: {bad}", file=sys.stderr)
        return EXIT_INPUT
    _check_free(a, "-record")
    spec = _load_only(a)
    if spec is None:
        return EXIT_INPUT
    scale = _scale(a, spec)
    if a.ray is None:  # (on a cluster the GPUs are the actors')
        loop.check_hardware(spec, match=not a.no_hw_check)
    run_dir = Path(a.run_dir) if a.run_dir else Path("runs") / f"{spec.name}-record"
    if a.reuse and Path(a.reuse).resolve() == run_dir.resolve():
        print(f"pipe record: --reuse {a.reuse} is the sweep's own run folder (it resumes without --reuse)",
              file=sys.stderr)
        return EXIT_INPUT
    dest = Path(a.out) if a.out else Path("datasets") / f"{spec.name}.json"
    if not a.out and dest.exists() and loop.recorded_to(run_dir) != dest.resolve():
        # a sweep would replace a dataset recorded earlier (the replay bench reads datasets/); one
        # resumed from the run folder that wrote that very file rewrites its own
        print(f"pipe record: {dest} exists, recorded earlier (pipe replay reads datasets/); this sweep does "
              "not replace it: name its dataset with --out FILE, or remove that file first", file=sys.stderr)
        return EXIT_INPUT
    writable(dest)
    r = loop.record(spec, run_dir, dest, Path(a.reuse) if a.reuse else None, a.minutes, a.quiet, a.force,
                    scale=scale, on_reuse=lambda n: print(f"pipe record: {n} verdicts of {a.reuse} may stand for this "
                                             "template's kernels"))
    by = r["by_status"]
    print(f"recorded {r['recorded']} of {r['size']} configurations ({', '.join(f'{k} {v}' for k, v in sorted(by.items()))}) "
          f"to {dest}" + (f"; {r['reused']} verdicts reused from an earlier run (the same kernel source and launch)"
                          if r["reused"] else ""))
    return EXIT_OK if r["trials"] >= r["size"] else EXIT_BUDGET


def cmd_merge(a) -> int:
    from .search import dataset

    try:
        m = dataset.merge(a.datasets, out=a.out)
    except dataset.MergeError as e:
        print(f"pipe merge: {e}", file=sys.stderr)
        return EXIT_INPUT
    dest = Path(a.out)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(dataset.dumps(m.data))
    except OSError as e:
        print(f"pipe merge: cannot write {dest}: {e.strerror or e}", file=sys.stderr)
        return EXIT_INPUT
    for line in dataset.overlap_lines(m):
        print(line)
    parts = ", ".join(f"part {i}: {p['trials']}" for i, p in enumerate(m.data["parts"]))
    print(f"merged {len(m.data['trials'])} configurations from {len(a.datasets)} files to {dest} ({parts})")
    return EXIT_OK


def cmd_replay(a) -> int:
    from .search import replay

    agents, why = replay.strategies(a.agent)
    if why:
        print(f"--agent: {why}", file=sys.stderr)
        return EXIT_INPUT
    paths = a.datasets or [str(p) for p in replay.datasets()]
    for p in paths:
        if not Path(p).is_file():
            print(f"{p}: no such dataset", file=sys.stderr)
            return EXIT_INPUT
        try:
            json.loads(Path(p).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            print(f"pipe replay: {p}: not a dataset (not readable as JSON: {e})", file=sys.stderr)
            return EXIT_INPUT
    if a.patience is not None and a.patience < 1:
        print(f"--patience: {a.patience} is not a positive number of trials", file=sys.stderr)
        return EXIT_INPUT
    if a.seeds < 1:
        print(f"--seeds: {a.seeds} is not a positive number of simulated runs", file=sys.stderr)
        return EXIT_INPUT
    try:
        if a.patience:
            out = [replay.replay_patience(p, ag, a.seeds, a.patience) for p in paths for ag in agents]
            if a.json:
                print(json.dumps(out if len(out) > 1 else out[0], indent=2))
            else:
                print("\n".join(replay.format_patience(r) for r in out))
        elif a.json:
            out = [replay.replay(p, ag, a.seeds) for p in paths for ag in agents]
            for r in out:  # per-seed lists stay; keys as strings for JSON
                r["thresholds"] = {f"{x:g}": v for x, v in r["thresholds"].items()}
            print(json.dumps(out if len(out) > 1 else out[0], indent=2))
        else:
            print(replay.format_table(replay.bench(paths, agents, a.seeds)))
    except (ValueError, KeyError) as e:
        print(f"pipe replay: {e}", file=sys.stderr)
        return EXIT_INPUT
    return EXIT_OK


def _summary(run_dir: Path) -> dict:
    from .ledger.rundir import read_summary

    return read_summary(run_dir)


def cmd_runs(a) -> int:
    root = Path(a.root)
    if not root.is_dir() and (root.exists() or a.root != "runs"):  # (no runs/ yet: no runs)
        print(f"pipe runs: {root} is {'a file, not a folder' if root.exists() else 'no folder'}", file=sys.stderr)
        return EXIT_INPUT
    dirs = sorted(p.parent for p in root.glob("**/ledger.db")) if root.is_dir() else []
    if not dirs:
        print(f"no run folders under {root}/")
        return EXIT_OK
    lines = []
    for d in dirs:
        try:
            s = _summary(d)
        except PipeError as e:
            lines.append((str(d), f"unreadable: {e}", "", ""))
            continue
        b = s["best"]
        best = f"#{b['trial']} {b['objective_s'] * 1e6:.2f} us {json.dumps(b['params'])}" if b else "-"
        status, bad = s["status"], s["ledger"]["first_bad_row"]
        if not s["ledger"]["intact"]:
            status = f"TAMPERED (row {bad})" if bad is not None else "TAMPERED"
        lines.append((str(d), str(status), str(s["trials"]), best))
    wd = max([40, *(len(x[0]) for x in lines)])
    ws = max([6, *(len(x[1]) for x in lines if x[2])])  # the status whole (an unreadable folder's reason runs on)
    print(f"{'run folder':<{wd}} {'status':<{ws}} {'trials':>6}  best")
    for d, status, trials, best in lines:
        print(f"{d:<{wd}} {status}" if not trials else f"{d:<{wd}} {status:<{ws}} {trials:>6}  {best}")
    return EXIT_OK


def cmd_show(a) -> int:
    from .progress import fmt_clock

    s = _summary(Path(a.run))
    led = s["ledger"]
    if a.json:
        print(json.dumps(s, indent=2, default=str))
        return EXIT_OK if led["intact"] else EXIT_BUDGET
    print(f"run {a.run}: spec {s['spec']} ({s['spec_path']}), status {s['status']}")
    if s["status"] == "failed" and s.get("stop"):
        print(f"stopped on: {s['stop']}")
    if s.get("agent_confinement"):  # a command agent's: confined, or run without it on purpose
        print(f"agent: {s['agent_confinement']['detail']}")
    print(f"trials: {s['trials']}  " + "  ".join(f"{k} {v}" for k, v in sorted(s["by_status"].items())))
    if s["baseline"]:
        print("baseline (" + s["baseline"]["mode"] + "): " + ", ".join(
            f"{d['median'] * 1e6:.2f} us ±{d.get('spread', 0):.0%}" for d in s["baseline"]["shapes"]))
    b = s["best"]
    if b:
        print(f"best: trial #{b['trial']} {json.dumps(b['params'])}")
        print(f"  geometric-mean time {b['objective_s'] * 1e6:.3f} us" +
              (f", metric {b['metric']:.4g}" if b["metric"] is not None else ""))
        spreads = b.get("spreads") or []
        for i, d in enumerate(b.get("shapes") or []):
            sp = f" ±{spreads[i]:.0%}" if i < len(spreads) and spreads[i] is not None else ""
            if d.get("time_s") is None:  # op.domain: a size this configuration does not serve
                print(f"  shape {i}: not served by this configuration (kernel.serves)")
                continue
            line = f"  shape {i}: {d['time_s'] * 1e6:.3f} us{sp}, {d['bytes_per_s'] / 1e9:.1f} GB/s, " \
                   f"{d['limit_fraction']:.3f} of the limit" + \
                   ("" if s.get("limit_measured", True) else " (the profile's upper bound, not measured)")
            if "speedup" in d:
                line += f", {d['speedup']:.2f}x the baseline"
            clocks = b.get("clocks") or []
            # timed below full clock: the figure is one at that clock
            line += fmt_clock(clocks[i] if i < len(clocks) else None)
            print(line)
        if b.get("lean"):
            ln = b["lean"]
            print(f"  verification's widest lean {ln['mean']:+.4f} units of the output's rounding "
                  f"(standard error {ln['se']:.4f}, {ln['n']} elements; refused beyond +-1/8)")
        if b.get("precision"):  # a variant's: its mean |error| against the approved build's, same inputs
            pr, tm = b["precision"], b["precision"].get("timed") or {}
            if pr.get("n"):
                print(f"  a variant's mean error {pr['mine']:.4f} units of the output's rounding against the approved "
                      f"build's {pr['approved']:.4f} on the same inputs ({pr['n']} elements)"
                      + (f"; in its checked timed calls {tm['mine']:.4f} against {tm['approved']:.4f} "
                         f"({tm['n']})" if tm.get("n") else ""))
            if pr.get("wide"):
                w, tw = pr["wide"], tm.get("wide")
                print(f"  a variant's fp32/fp64 outputs: mean log2(1 + |error| in units of their rounding) "
                      f"{w['mine']:.3f} against the approved build's {w['approved']:.3f} on the same inputs "
                      f"({w['n']} elements; 8 times worse on {w.get('worse', 0):.2%}, better on "
                      f"{w.get('better', 0):.2%}; past the approved build's range on {w.get('reach', 0):.2%}, "
                      f"its own {w.get('reach_approved', 0):.2%})"
                      + (f"; in its checked timed calls {tw['mine']:.3f} against {tw['approved']:.3f} ({tw['n']})"
                         if tw else ""))
    if s.get("goal_check"):
        from .loop import recorded_goal_check_line

        c = s["goal_check"]
        print(recorded_goal_check_line(s["spec_path"], c))
        gone = [k for k in dict.fromkeys(c.get("kernels", [])) if not s.get("ledger", {}).get("intact", True)
                and (s["ledger"].get("first_bad_row") or 1e18) <= k]
        if gone:
            print(f"  (the goal check's trials {', '.join(f'#{k}' for k in gone)} are at or after the ledger's first bad row)")
    per = s.get("best_per_shape") or []
    # each shape's fastest (what pipe export ships), where that is not the best alone
    if per and {p["trial"] for p in per if p} - ({b["trial"]} if b else set()):
        print("best per shape (recorded times; pipe compare re-times them side by side):")
        for i, p in enumerate(per):
            if p:
                print(f"  shape {i}: trial #{p['trial']} {p['time_s'] * 1e6:.3f} us {json.dumps(p['params'])}")
        if s.get("table_metric") is not None:
            print(f"  metric of this dispatch table {s['table_metric']:.4g}")
    if s["first_ok"] and b:
        print(f"first correct trial: #{s['first_ok']['trial']} {s['first_ok']['objective_s'] * 1e6:.3f} us "
              f"-> best {b['objective_s'] * 1e6:.3f} us ({s['first_ok']['objective_s'] / b['objective_s']:.2f}x)")
    if led["intact"]:
        print("ledger chain: intact" + (f" ({led['note']})" if led["note"] else ""))
        return EXIT_OK
    bad = led["first_bad_row"]
    print("ledger: BROKEN at " + (f"row {bad}" if bad is not None else "its head") + f": {led['reason']}")
    if led["resumed_after"] is not None:
        print(f"  the best figures above come from rows before #{bad} and after #{led['resumed_after']} "
              "(appended by a run resumed with --force)")
    elif bad is not None:
        print(f"  the best figures above come from rows before #{bad} only" if bad > 1
              else "  no row can be trusted: no best is shown")
    return EXIT_BUDGET


def cmd_compare(a) -> int:
    import time

    from .ship.compare import compare_and_write, format_table

    t0 = time.monotonic()

    def progress(line: str) -> None:  # on stderr: the table alone goes to stdout
        if not a.quiet:
            print(f"[{time.monotonic() - t0:7.1f} s] {line}", file=sys.stderr, flush=True)

    if a.points is not None and a.points < 1:
        print(f"--points: {a.points} is not a positive number of points", file=sys.stderr)
        return EXIT_INPUT
    if a.verify_sizes is not None and a.verify_sizes < 1:
        print(f"--verify-sizes: {a.verify_sizes} is not a positive number of sizes", file=sys.stderr)
        return EXIT_INPUT
    if a.json:
        writable(Path(a.json))
    doc = compare_and_write(Path(a.run), Path(a.json) if a.json else None, a.spec, top=a.top, rounds=a.rounds,
                            torch_compile=not a.no_compile, triton=not a.no_triton, force=a.force,
                            points=a.points, arms=not a.no_arms, progress=progress, verify=a.verify_sizes)
    print(format_table(doc))
    return EXIT_OK


def cmd_export(a) -> int:
    from .ship.export import describe, export

    writable(Path(a.out), folder=True)
    pkg = export(Path(a.run), Path(a.out), a.name, a.spec, force=a.force,
                 exact=Path(a.exact) if a.exact else None, exact_spec=a.exact_spec)
    print("\n".join(describe(pkg)))
    return EXIT_OK


def cmd_report(a) -> int:
    from .ship import report

    if a.out:
        writable(Path(a.out), folder=True)
    h, m = report.write(Path(a.run), Path(a.out) if a.out else None, a.spec, force=a.force)
    print(f"report: {h} (open it in a browser; no server needed) and {m}")
    return EXIT_OK


def _scale_flags(p) -> None:
    g = p.add_argument_group("scale out (docs/commands.md, 'Scaling out')")
    g.add_argument("--workers", type=int, metavar="N",
                   help="CPU backend: N judge workers, each pinned to runtime.threads cores of its own; "
                        "with --ray: at most N actors")
    g.add_argument("--gpus", metavar="all|I,J", help="CUDA: one judge worker per listed GPU of this host "
                   "(GPUs that differ are refused)")
    g.add_argument("--ray", metavar="ADDRESS", help="a Ray cluster ('auto': the one started here with "
                   "`ray start`; 'local': start one in this process): a judge actor per GPU (per "
                   "runtime.threads CPUs on the CPU backend); needs the ray extra")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipe", description="Autoresearch for GPU kernels, driven by a YAML spec.",
                                epilog="--log-json and -v go before the command: pipe -v run SPEC")
    p.add_argument("--version", action="version", version=f"pipe {__version__}")
    p.add_argument("--log-json", action="store_true", help="logs as JSON lines on stderr")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logs (one event per trial)")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the autoresearch loop (the same --run-dir again resumes)")
    r.add_argument("spec")
    r.add_argument("--run-dir", help="run folder (default runs/<spec name>)")
    r.add_argument("--max-trials", type=int, help="trial budget, overriding the spec's")
    r.add_argument("--minutes", type=float, help="time budget, overriding the spec's")
    r.add_argument("--no-hw-check", action="store_true", help="run even if the GPU does not match the profile")
    r.add_argument("-q", "--quiet", action="store_true", help="no per-trial lines")
    r.add_argument("--force", action="store_true", help="go on over a ledger that fails its check (a warning is logged)")
    r.add_argument("--only", action="append", metavar="NAME=V1,V2",
                   help="search the subspace where NAME takes only these values (repeatable); the run's "
                        "trials are verdicts of the whole spec, so compare and export read it as any run")
    _scale_flags(r)
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("compare", help="time a run's per-shape best against torch eager, torch.compile, "
                                      "Triton, the spec's named arms and the copy ceiling, side by side")
    c.add_argument("run", help="run folder")
    c.add_argument("--spec", help="the run's spec (default: the path the run recorded)")
    c.add_argument("--json", help="also write the figures here (always written to RUN/compare.json)")
    c.add_argument("--top", type=int, default=3, help="candidates per shape: the fastest K on it (default 3)")
    c.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds, at least 2: the even ones pick "
                   "each shape's winner, the odd ones give its time (default 4)")
    c.add_argument("--points", type=int, help="with op.domain: secret points of the curve across the domain "
                   "(default 24)")
    c.add_argument("--verify-sizes", type=int, metavar="N", help="with op.domain: the sizes each kernel of the "
                   "range table is verified at over each range it is listed for (default 48; fewer where the "
                   "table is large, never fewer than 8 but by this option)")
    c.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    c.add_argument("--no-triton", action="store_true", help="leave out the Triton kernel (op.triton)")
    c.add_argument("--no-arms", action="store_true", help="leave out the spec's named arms (op.arms)")
    c.add_argument("--force", action="store_true", help="go on over a ledger that fails its check (a warning is logged)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr (each stage and timing request)")
    c.set_defaults(fn=cmd_compare)
    ex = sub.add_parser("export", help="write an importable package: a torch custom op dispatching by shape to "
                                       "the tuned kernels (cubins shipped) or to the torch reference")
    ex.add_argument("run", help="run folder (pipe compare's figures are used when present)")
    ex.add_argument("--out", default="exported", help="folder for the package (default exported/)")
    ex.add_argument("--name", help="package name (default: the spec's name)")
    ex.add_argument("--spec", help="the run's spec (default: the path the run recorded)")
    ex.add_argument("--exact", help="with op.domain: a run of the same op with its sizes compiled in, whose "
                    "kernels (after pipe compare) take their tuned sizes where they were faster there")
    ex.add_argument("--exact-spec", help="the --exact run's spec (default: the path it recorded)")
    ex.add_argument("--force", action="store_true", help="go on over a ledger that fails its check (a warning is logged)")
    ex.set_defaults(fn=cmd_export)
    rr = sub.add_parser("report", help="a self-contained HTML report (plots) and a markdown summary of a run")
    rr.add_argument("run", help="run folder")
    rr.add_argument("--out", help="folder for report.html and report.md (default: the run folder)")
    rr.add_argument("--spec", help="the run's spec (default: the path the run recorded); without a matching "
                                   "spec the report has no floors and no roofline")
    rr.add_argument("--force", action="store_true", help="go on over a ledger that fails its check (a warning is logged)")
    rr.set_defaults(fn=cmd_report)
    v = sub.add_parser("validate", help="check specs; errors as file:line:col")
    v.add_argument("specs", nargs="+", help="spec files to check")
    v.set_defaults(fn=cmd_validate)
    x = sub.add_parser("render", help="print the kernel source for a parameter fill")
    x.add_argument("spec")
    x.add_argument("--set", action="append", metavar="NAME=VALUE", help="a parameter (default: the spec's start)")
    x.add_argument("--shape", default="0", help="the shape to render for: I (op.shapes[I]), extra:I "
                   "(op.extra_shapes[I]) or held:I (op.held_out_shapes[I]); default 0")
    x.add_argument("--compile", action="store_true", help="compile the rendered source with the backend's "
                   "compiler instead of printing it (no GPU needed): exit 0 if it compiles, 1 if not")
    x.add_argument("--variant", metavar="FILE", help="render a template variant (the whole template text, as "
                   "pipe eval --variant takes it) instead of the spec's template; with --compile it is judged "
                   "as a variant's trial is, against the approved template's build")
    x.set_defaults(fn=cmd_render)
    ev = sub.add_parser("eval", help="judge one candidate, append it to the run's ledger, print the verdict")
    ev.add_argument("spec")
    ev.add_argument("--params", required=True, help="JSON object of parameter values (missing ones: the spec's start)")
    ev.add_argument("--variant", help="a template variant file (the whole template text)")
    ev.add_argument("--run-dir", help="run folder (default runs/<spec name>); shared with pipe run")
    ev.add_argument("--json", action="store_true", help="the verdict as JSON on stdout")
    ev.add_argument("--no-hw-check", action="store_true", help="judge even if the GPU does not match the profile")
    ev.add_argument("--force", action="store_true", help="go on over a ledger that fails its check (a warning is logged)")
    ev.set_defaults(fn=cmd_eval)
    rc = sub.add_parser("record", help="run the whole space (grid) and write it as a replay dataset")
    rc.add_argument("spec")
    rc.add_argument("--out", help="dataset file (default datasets/<spec name>.json)")
    rc.add_argument("--run-dir", help="run folder of the sweep (default runs/<spec name>-record); resumes")
    rc.add_argument("--only", action="append", metavar="NAME=V1,V2",
                    help="sweep the subspace where NAME takes only these values (repeatable)")
    rc.add_argument("--minutes", type=float,
                    help="stop after this many minutes of this call; the same --run-dir resumes, and the "
                         "dataset holds what is recorded so far")
    rc.add_argument("--reuse", metavar="RUN_DIR",
                    help="an earlier sweep of the same spec but for its template: configurations whose "
                         "rendered source and launch are unchanged take its verdicts (marked reused), the "
                         "others are judged")
    rc.add_argument("--no-hw-check", action="store_true", help="record even if the GPU does not match the profile")
    rc.add_argument("-q", "--quiet", action="store_true", help="no per-trial lines")
    rc.add_argument("--force", action="store_true", help="go on over a ledger that fails its check (a warning is logged)")
    _scale_flags(rc)
    rc.set_defaults(fn=cmd_record)
    mg = sub.add_parser("merge", help="join replay datasets of one spec recorded in parts (pipe record --only); "
                                      "a configuration in several takes the later file's trial")
    mg.add_argument("datasets", nargs="+", metavar="DATASET", help="two or more dataset files, the oldest first")
    mg.add_argument("--out", required=True, help="the merged dataset file")
    mg.set_defaults(fn=cmd_merge)
    rp = sub.add_parser("replay", help="simulate tuning on recorded datasets (no GPU): evaluations to the best")
    rp.add_argument("datasets", nargs="*", help="dataset files (default: datasets/*.json)")
    rp.add_argument("--agent", help="strategy, or a comma-separated list (default: every built-in strategy)")
    rp.add_argument("--seeds", type=int, default=25, help="simulated runs per agent and dataset (default 25)")
    rp.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    rp.add_argument("--patience", type=int, metavar="N",
                    help="in place of the evaluations to the best: where a run whose goal has patience N "
                         "stops, and how close its dispatch table is to the best then")
    rp.set_defaults(fn=cmd_replay)
    rs = sub.add_parser("runs", help="list run folders with status and best")
    rs.add_argument("--root", default="runs", help="the folder holding run folders (default runs)")
    rs.set_defaults(fn=cmd_runs)
    hw = sub.add_parser("hw", help="measure this GPU's copy and read bandwidth and bf16 matmul rate, for a "
                                   "hardware profile (docs/commands.md)")
    hw.add_argument("--profile", help="compare with this profile (a name under hw_profiles/ or a file; default: "
                                      "pipe's profile whose device_name this GPU carries)")
    hw.add_argument("--reps", type=int, default=20, help="timed calls per figure (default 20)")
    hw.add_argument("--json", help="also write the figures to this file")
    hw.set_defaults(fn=cmd_hw)
    s = sub.add_parser("show", help="a run's summary")
    s.add_argument("run", help="a run folder")
    s.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    s.set_defaults(fn=cmd_show)
    return p


def main(argv: list[str] | None = None) -> int:
    from .core import log

    p = parser()
    a = p.parse_args(argv)
    log.configure(json_logs=a.log_json, verbose=a.verbose)
    _MADE.clear()
    import signal

    def terminated(*_):  # SIGTERM as Ctrl-C: the same clean-up and message, its own exit status
        raise _Terminated()

    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, terminated) if main_thread else None
    try:
        return _run(a)
    finally:
        if main_thread:  # (None: a handler set outside Python, which cannot be put back: the default)
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def _run(a) -> int:
    try:
        rc = a.fn(a)
        if rc not in (EXIT_OK, None):
            _unmake()
        return rc
    except SpecError as e:
        _unmake()
        print(str(e), file=sys.stderr)
        return EXIT_INPUT
    except PipeError as e:
        _unmake()
        print(f"pipe: {e}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt as e:
        what = "terminated" if isinstance(e, _Terminated) else "interrupted"
        print(f"pipe: {what}" + ("; every finished trial is in the ledger (run again to resume)"
                                 if a.cmd in ("run", "eval", "record") else ""), file=sys.stderr)
        return 143 if isinstance(e, _Terminated) else 130
    except BrokenPipeError:  # output piped into head and the like
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
