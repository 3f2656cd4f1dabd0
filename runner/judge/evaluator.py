"""One trial: forbid → render → forbid → compile → verify and time → figures.

`Evaluator.run(params)` returns a ledger Trial whatever happens; every
per-trial failure is a status with a reason. Deciding whether the trial
beats the incumbent is `Evaluator.decide`: a faster-looking candidate is
re-timed interleaved with the incumbent and kept only if it is faster
beyond the noise of that paired measurement.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..build import backends, forbid, render
from ..core import figures
from ..core.errors import ExprError
from ..ledger.ledger import Trial

REUSABLE = ("ok", "wrong", "impossible", "fault", "hang")  # the worker's verdicts on a binary
# what another run's verdict on the same kernels carries over (pipe record --reuse): the
# worker's verdicts that follow from the code (not a fault or hang, which may have been the
# machine's) and the compiler's spill pruning
REUSED = ("ok", "wrong", "impossible", "pruned")
_OLD_TEMPLATE = "\0reuse: the earlier run's template"
RETIME_ROUNDS = 5
MIN_GAIN = 0.01  # a keep must be at least 1% faster in the paired re-timing
REBUILD_MARGIN = 0.05  # without a paired re-timing, a keep must be 5% faster
CONFIRM_ROUNDS = 7  # paired rounds of a goal check (Evaluator.confirm_goal)


@dataclass
class Build:
    status: str  # ok, forbidden, compile_error (or the backend's), pruned
    reason: str = ""
    artifacts: list | None = None  # per source, when ok
    resources: dict | None = None  # source -> compiler report, once everything compiled
    compile_s: float = 0.0
    log: str = ""
    ptx: dict | None = None  # the classified PTX instructions of every shape's build (ptx.merge)
    ptx_approved: dict | None = None  # those of the approved template's build, for a variant


def geometry_key(geometry: list[dict]) -> str:
    return json.dumps(geometry, sort_keys=True)


def sources_hash(sources: list[str]) -> str:
    """The rendered source of every shape, in shape order (two shapes that swap which code
    they run give another hash, where Trial.source_hash, over the distinct sources, does not)."""
    return render.source_hash("\0".join(sources))


# the code a verdict depends on besides the spec: the judge, the backends (compile options,
# pruning, launches, timing), the forbidden-action checks and the figures
_JUDGE_CODE = ("judge/*.py", "build/backends/*.py", "build/forbid.py", "build/ptx.py", "core/figures.py")
_SPEC_PARTS = ("spec", "hardware", "reference")  # must match for a run's verdicts to be offered
_MADE_WITH = ("toolchain", "judge")  # must match per trial (a resumed run may have changed them)


def run_parts(spec) -> dict[str, str]:
    """What a run's verdicts depend on, part by part: the spec's (spec file, template, hardware
    profile, reference), the backend's compiler and the judge's own code."""
    be = backends.get(spec.kernel.backend)
    judge = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]  # the package
    for pattern in _JUDGE_CODE:
        for f in sorted(root.glob(pattern)):
            judge.update(f.read_bytes())
    try:
        tool = be.toolchain()
    except Exception as e:  # no compiler here: nothing can match it
        tool = f"unavailable ({type(e).__name__})"
    return {**spec.hash_parts, "toolchain": f"{spec.kernel.backend}: {tool}", "judge": judge.hexdigest()[:16]}


def made_with(parts: Mapping[str, str]) -> str:
    """The compiler and judge code a trial was judged with, as one digest (each trial keeps it)."""
    return hashlib.sha256(json.dumps([parts.get(k) for k in _MADE_WITH]).encode()).hexdigest()[:16]


def reusable_verdicts(spec, run_dir: Path, force: bool = False) -> dict[tuple[str, str], tuple[Trial, dict]]:
    """The verdicts of the run in `run_dir` that stand for `spec`, by (the rendered source of
    every shape, launch geometry). That run must have been made with the same spec file,
    hardware profile and reference, and each reused trial judged with this run's compiler and
    judge code (the digest it keeps; a trial that predates it, the digest the run recorded):
    only the template may differ, so a configuration whose every shape renders the same source
    and launches the same way is the same binary judged under the same inputs, shapes,
    tolerances and timing protocol (its times were measured in that run's calls, as a resumed
    sweep's are). Trials judged before per-shape source digests were kept are rendered again
    from the template the run stored. Each reused trial names its origin (details
    `reused_from`: run folder, trial id, when it was judged), the first judging run's where
    that trial was itself reused."""
    from ..core.errors import RunDirError
    from ..ledger.ledger import Ledger

    run_dir = Path(run_dir).resolve()
    from ..ledger.rundir import guard

    led = Ledger.read(run_dir, damaged_ok=True)
    try:
        old = guard(run_dir, led, force, "reuse its verdicts").trials
        parts, old_template = led.hash_parts(), led.get_meta("template")
    finally:
        led.close()
    if parts is None or any(k not in parts for k in _SPEC_PARTS):
        raise RunDirError(f"{run_dir}: that run does not record what its verdicts depend on (it was begun "
                          "by an older pipe); resume it once with the template, compiler and pipe it was "
                          "made with, which adds it, or sweep anew")
    mine = run_parts(spec)
    differ = [k for k in _SPEC_PARTS if parts[k] != mine[k]]
    if differ:
        raise RunDirError(f"{run_dir}: made with another {' and '.join(differ)} than this run; only the "
                          "template may differ for its verdicts to stand (the same inputs, shapes, timing, "
                          "hardware and reference)")
    stamp = made_with(mine)
    run_stamp = made_with(parts) if all(k in parts for k in _MADE_WITH) else None
    ev = Evaluator(spec, None, None)
    if old_template is not None:
        ev.variants[_OLD_TEMPLATE] = old_template
    out: dict[tuple[str, str], tuple[Trial, dict]] = {}
    for t in old:
        if t.variant is not None or t.status not in REUSED:
            continue
        if t.details.get("made_with", run_stamp) != stamp:  # another compiler or judge
            continue
        key = t.details.get("sources_hash")
        if key is None and old_template is not None:
            try:
                key = sources_hash(ev.render_all(t.params, _OLD_TEMPLATE))
            except (render.RenderError, ExprError):
                continue
        if key is None:
            continue
        origin = t.details.get("reused_from") or {"run": str(run_dir), "trial": t.id,
                                                  "judged_at": round(t.finished_at, 3)}
        out.setdefault((key, geometry_key(ev.geometry(t.params))), (t, origin))
    return out


class Evaluator:
    def __init__(self, spec, worker, baseline: list[float] | None):
        self.spec = spec
        self.worker = worker
        self.baseline = baseline
        self.baseline_spreads: list[float] | None = None  # the baseline's own, per shape (Session sets it)
        self.backend = backends.get(spec.kernel.backend)
        self.ctype = render.CTYPES[spec.kernel.backend][spec.op.dtype]
        self.sources: dict[str, list[str]] = {}  # trial key -> rendered sources per shape
        self.artifacts: dict[str, list[str]] = {}  # trial key -> artifact per shape
        self.variants: dict[str, str] = {}  # variant id -> template text
        self.judged: dict[str, Trial] = {}  # binaries and launches -> the trial the worker judged them in
        # (source hash, launch geometry) -> (an earlier run's trial, its provenance): reusable_verdicts
        self.reuse: dict[tuple[str, str], tuple[Trial, dict]] = {}
        self._made_with: str | None = None  # the compiler and judge digest each trial keeps
        self._digests: dict[str, str] = {}  # artifact path -> content digest

    def template(self, variant: str | None) -> tuple[str, str]:
        """(text, name) of the spec's template or of a variant."""
        if variant is None:
            return self.spec.kernel.template, Path(self.spec.kernel.template_path).name
        return self.variants[variant], f"variant-{variant}"

    def render_all(self, params: dict, variant: str | None = None, shapes=None) -> list[str]:
        """The source for every shape (the spec's timed and extra shapes unless `shapes` is given)."""
        text, name = self.template(variant)
        if variant is not None:
            try:
                used = render.template_variables(text)
            except Exception as e:  # jinja2.TemplateSyntaxError and friends
                line = getattr(e, "lineno", None)
                hint = render.syntax_hint(text, line) if line else None
                raise render.RenderError(f"{name}: does not parse: {e}" + (f"; {hint}" if hint else "")) from None
            extra = sorted(used - set(params) - set(self.spec.op.symbols) - set(render.DTYPE_VARS)
                           - {n for n, _ in self.spec.kernel.derive})
            if extra:
                raise render.RenderError(f"{name}: uses {', '.join(extra)}, which are no search parameters, "
                                         "shape symbols or dtype variables")
        ctx = {**params, "dtype": self.spec.op.dtype, "ctype": self.ctype}
        k = self.spec.kernel
        return [render.render(text, {**ctx, **shape, **k.derived({**shape, **params})}, name)
                for shape in (self.spec.op.all_shapes if shapes is None else shapes)]

    def geometry(self, params: dict, shapes=None) -> list[dict]:
        k = self.spec.kernel
        out = []
        for shape in (self.spec.op.all_shapes if shapes is None else shapes):
            env = {**shape, **params}
            env.update(k.derived(env))
            geo = {"grid": [int(e(env)) for e in k.grid], "block": [int(e(env)) for e in k.block],
                   "shared_mem": int(k.shared_mem(env)) if k.shared_mem else 0}
            if k.cluster:
                geo["cluster"] = [int(e(env)) for e in k.cluster]
            out.append(geo)
        return out

    def run(self, params: dict, agent: str, variant: str | None = None, on_built=None) -> Trial:
        """Judge one candidate; `variant` is the id of a template variant in self.variants.
        `on_built` is called once the candidate is built and before the worker judges it (the
        loop asks its agent for the next proposal there and compiles that beside the judge)."""
        t0 = time.time()
        trial = Trial(params=dict(params), status="ok", agent=agent, spec_hash=self.spec.hash, started_at=t0,
                      variant=variant)

        def done(status: str, reason: str = "") -> Trial:
            trial.status, trial.reason = status, reason
            trial.finished_at = time.time()
            trial.wall_s = trial.finished_at - t0
            return trial

        sp = self.spec
        try:
            v = forbid.check_params(params, sp.forbidden.rules, sp.op.all_shapes)
        except ExprError as e:
            return done("error", f"forbidden rule failed to evaluate: {e}")
        if v:
            return done("forbidden", str(v))
        try:
            sources = self.render_all(params, variant)
            geometry = self.geometry(params)
        except (render.RenderError, ExprError) as e:
            return done("render_error", str(e))
        unique = list(dict.fromkeys(sources))  # templates that read shape symbols render once per shape
        trial.source_hash = render.source_hash("\n".join(unique))
        trial.details["sources_hash"] = shapes_key = sources_hash(sources)
        if self._made_with is None:
            self._made_with = made_with(run_parts(sp))
        trial.details["made_with"] = self._made_with
        prior = self.reuse.get((shapes_key, geometry_key(geometry))) if variant is None else None
        if prior is not None:  # an earlier run judged this very source and launch under the same spec
            old, trial.details["reused_from"] = prior
            self.sources[trial.key] = sources
            if old.status != "ok":
                return done(old.status, old.reason)
            self._score(trial, list(old.times), list(old.spreads or []))  # against this run's baseline
            return done("ok")
        t_build = time.perf_counter()
        b = self.build(sources, geometry, self.approved_sources(params, variant))
        trial.details["build_wall_s"] = round(time.perf_counter() - t_build, 4)
        if b.ptx is not None:
            trial.details["ptx_counts"] = b.ptx
        if b.ptx_approved is not None:
            trial.details["ptx_counts_approved"] = b.ptx_approved
        if b.resources is None:  # forbidden, or a compile failure
            if b.log:
                trial.details["compile_log"] = b.log[-4000:]
            return done(b.status, b.reason)
        trial.details["compile_s"] = round(b.compile_s, 4)
        trial.details["resources"] = b.resources[sources[0]]
        if b.status != "ok":
            return done(b.status, b.reason)
        artifacts = b.artifacts
        # Parameters the template ignores for these shapes give the very same binaries and launches
        # as a configuration judged already: its verdict is this one's (no new information
        # would come from judging the same code again), and the worker's time goes elsewhere.
        bkey = self._binary_key(artifacts, geometry)
        same = self.judged.get(bkey)
        if same is not None and same.id is not None and same.status in REUSABLE:
            trial.details["same_kernels_as"] = same.id
            if same.status != "ok":
                return done(same.status, f"the same kernels as trial #{same.id}: {same.reason}"[:2000])
            trial.times, trial.spreads = list(same.times), list(same.spreads or [])
            trial.details["shapes"] = same.details.get("shapes")
            trial.objective, trial.metric = same.objective, same.metric
            self.sources[trial.key], self.artifacts[trial.key] = sources, artifacts
            return done("ok")
        if on_built is not None:
            on_built()
        # Fresh, unpredictable input seeds for every trial (recorded, so a verdict can be replayed).
        trial.details["seed"] = seed = secrets.randbits(48)
        job = {"seed": seed, "artifacts": artifacts, "geometry": geometry}
        t_judge = time.perf_counter()
        verdict = self.worker.request(("evaluate", job), sp.runtime.timeout_s)
        trial.details["judge_wall_s"] = round(time.perf_counter() - t_judge, 4)
        if verdict.get("phases"):
            trial.details["judge_phases"] = verdict["phases"]
        if verdict.get("log_capped"):  # the kernel printed past the worker log's cap; the rest was dropped
            trial.details["log_capped"] = verdict["log_capped"]
            trial.details["log_cap_bytes"] = verdict.get("log_cap_bytes")
            if verdict.get("printf_fifo_bytes"):  # and what one launch may print on the device
                trial.details["printf_fifo_bytes"] = verdict["printf_fifo_bytes"]
        self.judged[bkey] = trial  # the worker's verdict on these binaries, whatever it is
        if verdict["status"] != "ok":
            return done(verdict["status"], verdict.get("reason", ""))
        trial.details["timed_calls"] = [s.get("n") for s in verdict["shapes"]]
        shapes = self._score(trial, [s["median"] for s in verdict["shapes"]],
                             [s["spread"] for s in verdict["shapes"]])
        self.sources[trial.key] = sources
        self.artifacts[trial.key] = artifacts
        bad = figures.impossible(sp, shapes)
        if bad:
            return done("impossible", bad)
        return done("ok")

    def _score(self, trial: Trial, times: list[float], spreads: list[float]) -> list[dict]:
        """Per-shape times into the trial's figures against this run's baseline; the per-shape figures."""
        trial.times, trial.spreads = times, spreads
        shapes = figures.per_shape(self.spec, times, self.baseline)
        trial.details["shapes"] = shapes
        trial.objective, trial.metric = figures.geomean(times), figures.metric(self.spec, shapes)
        ms = figures.metric_spread(self.spec, shapes, spreads, self.baseline_spreads)
        if ms is not None:
            trial.details["metric_spread"] = round(ms, 4)
        return shapes

    def _binary_key(self, artifacts: list[str], geometry: list[dict]) -> str:
        h = hashlib.sha256(geometry_key(geometry).encode())
        for a in artifacts:
            d = self._digests.get(a)
            if d is None:
                d = self._digests[a] = hashlib.sha256(Path(a).read_bytes()).hexdigest()
            h.update(d.encode())
        return h.hexdigest()

    def prebuild(self, params: dict, variant: str | None = None) -> None:
        """Compile a configuration's sources into the compile cache, ahead of its trial (no
        verdict: the trial itself builds again, from the cache, and judges)."""
        self.build(self.render_all(params, variant), self.geometry(params), self.approved_sources(params, variant))

    def approved_sources(self, params: dict, variant: str | None) -> list[str] | None:
        """For a variant, the approved template's source for every shape at the same parameters:
        the build its compiled code is judged against (None for the approved template itself,
        or where the template does not render at these parameters)."""
        if variant is None or variant == _OLD_TEMPLATE:
            return None
        try:
            return self.render_all(params, None)
        except (render.RenderError, ExprError):
            return None

    def build(self, sources: list[str], geometry: list[dict], approved: list[str] | None = None) -> "Build":
        """Forbidden rules, compiles (distinct sources side by side) and the profile's limits
        for per-shape sources and launches; the first failure in that order is the verdict.
        Where the backend reports the compiled code (CUDA: PTX and the preprocessed source),
        the source rules run again on the preprocessed source, and a variant's compiled code
        is judged against the approved template's build at the same parameters (`approved`,
        its source per shape); the approved template's own build is its own baseline."""
        sp = self.spec
        unique = list(dict.fromkeys(sources))
        for src in unique:
            v = forbid.check_source(src, sp.kernel.options, sp.kernel.backend, sp.forbidden.named,
                                    sp.forbidden.patterns)
            if v:
                return Build("forbidden", str(v))
        arts, resources, compile_s, comp = {}, {}, 0.0, {}
        for src, c in zip(unique, self._compile_all(unique)):  # a failure in shape order is reported
            compile_s += c.seconds
            if not c.ok:
                return Build(c.status, c.reason, compile_s=compile_s, log=c.log)
            arts[src] = c.artifact
            resources[src] = c.resources
            comp[src] = c
        judged = self._judge_compiled(sources, comp, approved)
        if judged is not None:
            why, mine, theirs = judged
            if why:
                return Build("forbidden", why, compile_s=compile_s, ptx=mine, ptx_approved=theirs)
        mine, theirs = (judged[1], judged[2]) if judged else (None, None)
        prune = getattr(self.backend, "prune", None)
        if prune is not None:
            for i, (src, geo) in enumerate(zip(sources, geometry)):
                why = prune(resources[src], geo, sp.hw, "spills" in sp.forbidden.named)
                if why:
                    return Build("pruned", f"shape {i}: {why}", resources=resources, compile_s=compile_s,
                                 ptx=mine, ptx_approved=theirs)
        return Build("ok", artifacts=[arts[s] for s in sources], resources=resources, compile_s=compile_s,
                     ptx=mine, ptx_approved=theirs)

    def _judge_compiled(self, sources: list[str], comp: dict, approved: list[str] | None):
        """(why it is forbidden or "", the candidate's PTX counts, the approved build's) from
        what the compiler reported, or None where the backend reports nothing."""
        from ..build import ptx

        sp = self.spec
        named = sp.forbidden.named
        if any(c.ptx is None for c in comp.values()):
            return None
        mine = ptx.merge([comp[s].ptx for s in dict.fromkeys(sources)])
        if approved is None or (not named and not sp.forbidden.patterns):
            return "", mine, None  # the approved template: its own build is what is allowed
        for src in dict.fromkeys(sources):  # a variant: the source rules after the preprocessor
            expanded, why = self.backend.expand(src, sp.kernel.options, sp.hw)
            if expanded is None:
                if named:
                    return (f"preprocessor: the source rules need the preprocessed source, and the "
                            f"preprocessor could not read it ({why})"), mine, None
                continue
            v = forbid.check_expanded(expanded, sp.kernel.backend, named, sp.forbidden.patterns)
            if v:
                return str(v), mine, None
        base_unique = list(dict.fromkeys(approved))
        base = dict(zip(base_unique, self._compile_all(base_unique)))
        ok = all(c.ok and c.ptx is not None for c in base.values())
        theirs = ptx.merge([base[s].ptx for s in base_unique]) if ok else None
        waived = self.backend.library_opcodes(sp.kernel.options, sp.hw)
        for i, (src, asrc) in enumerate(zip(sources, approved)):
            found = ptx.compare(comp[src].ptx, base[asrc].ptx if ok else None, named, waived)
            if found:
                action, why = found
                return (f"{action}: {forbid.NAMED[action].description}: shape {i}: {why}"
                        + ("" if ok else " (the approved template does not compile at these parameters)"),
                        mine, theirs)
        return "", mine, theirs

    def compiled(self, sources: list[str]) -> tuple[list[str] | None, object | None]:
        """(artifact per source, None), or (None, the first failed compile): distinct sources
        compiled side by side, mapped back to the per-shape list."""
        unique = list(dict.fromkeys(sources))
        comp = dict(zip(unique, self._compile_all(unique)))
        bad = next((c for c in comp.values() if not c.ok), None)
        return (None, bad) if bad is not None else ([comp[s].artifact for s in sources], None)

    def _compile_all(self, sources: list[str]) -> list:
        """Compile distinct sources side by side: in the backend's worker processes where it
        has them (NVRTC: backends.cuda.compile_all), else on threads (g++ runs as a process)."""
        sp = self.spec
        many = getattr(self.backend, "compile_all", None)
        if many is not None:
            return many(sources, sp.kernel.entry, sp.kernel.options, sp.hw)

        def one(src: str):
            return self.backend.compile(src, sp.kernel.entry, sp.kernel.options, sp.hw)

        if len(sources) == 1:
            return [one(sources[0])]
        with ThreadPoolExecutor(max_workers=min(8, len(sources))) as pool:
            return list(pool.map(one, sources))

    def decide(self, cand: Trial, best: Trial | None) -> None:
        """Set cand.kept. The first correct trial is kept; later ones must win a paired re-timing."""
        if cand.status != "ok":
            return
        if "same_kernels_as" in cand.details:  # the original had its chance against the incumbent
            return
        if best is None:
            cand.kept = True
            return
        if cand.objective >= best.objective:
            return
        inc = self.artifacts.get(best.key)
        if inc is None:  # incumbent from an earlier session: compile it again (cached on disk)
            inc = self._rebuild(best)
            if inc is None:  # cannot pair them: keep only a clear win, and say so
                cand.kept = cand.objective < best.objective * (1 - REBUILD_MARGIN)
                cand.details["retime"] = {"status": "skipped", "reason": "the incumbent could not be rebuilt; "
                                          f"kept only if {REBUILD_MARGIN:.0%} faster by its own timing"}
                return
        jobs = [{"artifacts": self.artifacts[cand.key], "geometry": self.geometry(cand.params)},
                {"artifacts": inc, "geometry": self.geometry(best.params)}]
        t0 = time.time()
        r = self.worker.request(("retime", jobs, RETIME_ROUNDS, secrets.randbits(48)),
                                self.spec.runtime.timeout_s * RETIME_ROUNDS * 2)
        if r["status"] != "ok":
            cand.details["retime"] = {"status": r["status"], "reason": r.get("reason", "")}
            if r["status"] == "wrong" and r.get("job") == 0:  # right when checked, wrong when re-timed
                cand.status, cand.reason = "wrong", r.get("reason", "")
            cand.wall_s += time.time() - t0
            return
        ratios = [figures.geomean(c) / figures.geomean(i) for c, i in r["medians"]]
        med = statistics.median(ratios)
        wins = sum(x < 1 for x in ratios)
        cand.kept = med < 1 - MIN_GAIN and wins > len(ratios) // 2
        cand.details["retime"] = {"ratios": [round(x, 4) for x in ratios], "median_ratio": round(med, 4),
                                  "wins": wins, "seconds": round(time.time() - t0, 3)}
        cand.wall_s += time.time() - t0

    def confirm_goal(self, picks: list[Trial], rounds: int = CONFIRM_ROUNDS) -> dict:
        """The goal's metric measured again, in paired rounds, before a run may say it met it.

        `picks[i]` is the trial whose kernel serves timed shape i (the best configuration on
        every shape, or the dispatch table of each shape's fastest). In each round the kernels
        and, for a speedup, the baseline's torch arm are timed back to back in one worker, on
        the same inputs, in alternating order; each round gives one value of the metric. The
        goal counts as met only if the conservative quartile meets it (the lower one for
        at_least, the upper one for at_most): a figure inside its own noise meets nothing.
        Returns {met, metric, low, high, rounds, values, kernels} or {met: False, error}."""
        sp = self.spec
        g = sp.goal
        arts, geos = [], []
        for i, t in enumerate(picks):
            a = self.artifacts.get(t.key) or self._rebuild(t)
            if a is None:
                return {"met": False, "error": f"trial #{t.id} could not be rebuilt"}
            arts.append(a[i])
            geos.append(self.geometry(t.params)[i])
        jobs = [{"artifacts": arts, "geometry": geos}]
        paired = g.metric == "speedup" and sp.baseline != "none"
        if paired:
            jobs.append({"torch": sp.baseline})
        t0 = time.time()
        # each arm for the spec's whole timing budget, as pipe compare times it
        r = self.worker.request(("retime", jobs, rounds, secrets.randbits(48), 1.0),
                                sp.runtime.timeout_s * rounds * len(jobs))
        out = {"kernels": [t.id for t in picks], "rounds": rounds, "goal": g.describe(), "metric_name": g.metric,
               "judged_on": "lower quartile" if g.at_least is not None else "upper quartile",
               "against": sp.baseline if paired else None, "seconds": round(time.time() - t0, 3)}
        if r["status"] != "ok":
            return {**out, "met": False, "error": f"{r['status']}: {r.get('reason', '')}"[:500]}
        values = []
        for row in r["medians"]:
            shapes = figures.per_shape(sp, row[0], row[1] if paired else None)
            values.append(figures.metric(sp, shapes))
        if any(v is None for v in values):
            return {**out, "met": False, "error": "the goal's metric could not be computed"}
        q = statistics.quantiles(sorted(values), n=4, method="inclusive") if len(values) >= 2 else [values[0]] * 3
        low, med, high = q[0], statistics.median(values), q[2]
        conservative = low if g.at_least is not None else high
        return {**out, "met": g.met(conservative), "metric": med, "low": low, "high": high,
                "min": min(values), "max": max(values), "values": [round(v, 6) for v in values]}

    def _rebuild(self, best: Trial) -> list[str] | None:
        try:
            sources = self.render_all(best.params, best.variant)
        except (render.RenderError, ExprError, KeyError):
            return None
        arts, _ = self.compiled(sources)
        if arts is not None:
            self.sources[best.key] = sources
        return arts
