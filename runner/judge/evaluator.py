"""One trial: build (build.builder: forbid → render → forbid → compile → check the
compiled code) → verify and time in the worker → figures → decide.

`Evaluator.run(params)` returns a ledger Trial whatever happens; every
per-trial failure is a status with a reason. Deciding whether the trial
beats the incumbent is `Evaluator.decide`: a faster-looking candidate is
re-timed interleaved with the incumbent and kept only if it is faster
beyond the noise of that paired measurement.
"""

from __future__ import annotations

import secrets
import statistics
import time

from ..build import forbid, render
from ..build.builder import Builder, geometry_key, sources_hash
from ..core import figures
from ..core.errors import ExprError
from ..core.records import Trial
from . import domain, invariance
from ..ledger.provenance import made_with, run_parts

def _spread_out(idx: list[int], xs: list, n: int) -> list:
    """Values for the shapes `idx` onto a list of n, None elsewhere."""
    out: list = [None] * n
    for i, x in zip(idx, xs):
        out[i] = x
    return out


REUSABLE = ("ok", "wrong", "impossible", "fault", "hang")  # the worker's verdicts on a binary
# what a trial's details say of its batch invariance (op.batch_invariant), carried over where
# a verdict is taken from another trial of the same kernels
INVARIANCE_DETAILS = ("batch_invariant", "batch_invariance", "batch_seed")
RETIME_ROUNDS = 5
RETIME_MORE = 6  # rounds more where the first RETIME_ROUNDS leave a keep in doubt (keep_rule)
MIN_GAIN = 0.01  # a keep must be at least 1% faster in the paired re-timing
REBUILD_MARGIN = 0.05  # without a paired re-timing, a keep must be 5% faster
CONFIRM_ROUNDS = 7  # paired rounds of a goal check (Evaluator.confirm_goal)


def bar_of(best) -> float:
    """The objective a candidate's own must be under before it is re-timed against `best`: best's
    `bar_s` (the bar it passed, times the median ratio of the re-timing that kept it: a chain of
    paired figures), else its own objective. With its own objective, a keep whose evaluation drew a
    lucky figure set a bar its own kernel does not hold, and later candidates as fast as the real
    one were never re-timed (session 55's red team)."""
    bar = (best.details or {}).get("bar_s")
    return float(bar) if isinstance(bar, (int, float)) and bar > 0 else best.objective


def keep_rule(ratios: list[float]) -> str:
    """A paired re-timing's verdict from its per-round ratios (candidate / incumbent): "keep",
    "drop" or "more" (re-time more rounds, then call again with all of them). The median must be
    under 1 - MIN_GAIN and most rounds won; after RETIME_ROUNDS rounds a keep also needs every
    round won, else more rounds are asked for, and then the upper quartile of all of them must
    be under 1 too: a ratio inside the rounds' own noise keeps nothing. (Most rounds won and the
    median alone kept an identical kernel against itself in 2 of 12 re-timings on a loaded
    two-core machine, session 55's red team: 8% of the ties that reach a re-timing.)"""
    med = statistics.median(ratios)
    wins = sum(x < 1 for x in ratios)
    if med >= 1 - MIN_GAIN or wins <= len(ratios) // 2:
        return "drop"
    if wins == len(ratios):
        return "keep"
    if len(ratios) <= RETIME_ROUNDS:
        return "more"
    q3 = sorted(ratios)[(3 * len(ratios)) // 4]
    return "keep" if q3 < 1 else "drop"


def _below_floor(spec, shapes: list[dict] | None, rounds: list[list]) -> str | None:
    """The first of a re-timing's candidate medians (a list per round, one time per shape of
    `shapes`, the spec's timed shapes where None) below the physical floor, described, or None."""
    fl = figures.floors(spec, shapes)
    for r, times in enumerate(rounds):
        bad = figures.impossible(spec, [{"time_s": t, "floor_s": f["floor"],
                                         "limit_fraction": f["floor"] / t if t else None} for t, f in zip(times, fl)])
        if bad:
            return f"round {r}, {bad}"
    return None


class Evaluator:
    """Judges built candidates in the worker, scores them against the baseline and decides
    whether one beats the incumbent; `builder` turns parameters into binaries."""

    def __init__(self, spec, worker, baseline: list[float] | None, builder: Builder | None = None):
        self.spec = spec
        self.worker = worker
        self.baseline = baseline
        self.builder = builder if builder is not None else Builder(spec)
        self.baseline_spreads: list[float] | None = None  # the baseline's own, per shape (Session sets it)
        self.sources: dict[str, list[str]] = {}  # trial key -> rendered sources per shape
        self.artifacts: dict[str, list[str]] = {}  # trial key -> artifact per shape
        self.judged: dict[str, Trial] = {}  # binaries and launches -> the trial the worker judged them in
        # (source hash, launch geometry) -> (an earlier run's trial, its provenance): reusable_verdicts
        self.reuse: dict[tuple[str, str], tuple[Trial, dict]] = {}
        self._made_with: str | None = None  # the compiler and judge digest each trial keeps

    def run(self, params: dict, agent: str, variant: str | None = None, on_built=None) -> Trial:
        """Judge one candidate; `variant` is the id of a template variant in self.builder.variants.
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
        plan = self._serves(params) if sp.op.domain else None
        if plan is not None and not plan[0]:
            return done("pruned", "serves no tuning point (kernel.serves)")
        try:
            shapes_built = None if plan is None else plan[2]
            sources = self.builder.render_all(params, variant, shapes_built)
            geometry = self.builder.geometry(params, shapes_built)
        except (render.RenderError, ExprError) as e:
            return done("render_error", str(e))
        unique = list(dict.fromkeys(sources))  # templates that read shape symbols render once per shape
        if plan is not None and len(unique) > 1:
            return done("render_error", "the source differs between shapes: with op.domain the sizes reach the "
                                        "kernel as arguments, and the template may not read them")
        trial.source_hash = render.source_hash("\n".join(unique))
        trial.details["sources_hash"] = shapes_key = sources_hash(sources)
        if self._made_with is None:
            self._made_with = made_with(run_parts(sp))
        trial.details["made_with"] = self._made_with
        prior = self.reuse.get((shapes_key, geometry_key(geometry))) if variant is None else None
        if prior is not None:  # an earlier run judged this very source and launch under the same spec
            old, trial.details["reused_from"] = prior
            trial.details.update({k: old.details[k] for k in INVARIANCE_DETAILS if k in old.details})
            self.sources[trial.key] = sources
            if old.status != "ok":
                return done(old.status, old.reason)
            self._score(trial, list(old.times), list(old.spreads or []))  # against this run's baseline
            return done("ok")
        t_build = time.perf_counter()
        b = self.builder.build(sources, geometry, self.builder.approved_sources(params, variant))
        trial.details["build_wall_s"] = round(time.perf_counter() - t_build, 4)
        if b.ptx is not None:
            trial.details["ptx_counts"] = b.ptx
        if b.ptx_approved is not None:
            trial.details["ptx_counts_approved"] = b.ptx_approved
        if b.resources is None:  # forbidden, or a compile failure
            if b.log:
                trial.details["compile_log"] = b.log[-4000:]
            if b.source is not None and b.status in ("compile_error", "forbidden"):  # its line, in the template
                text, name = self.builder.template(variant)
                segs = sp.kernel.template_segments if variant is None else None
                why = render.compiler_source_line(b.reason, text, b.source, segs, name)
                if len(unique) > 1 and b.source in sources:  # shapes render apart: which one's source
                    i = sources.index(b.source)
                    n = len(sp.op.shapes)
                    label = "" if shapes_built is not None else \
                        f" (pipe render --shape {i if i < n else f'extra:{i - n}'})"
                    why = f"at {(shapes_built or sp.op.all_shapes)[i]}{label}: {why}"
                return done(b.status, why)
            return done(b.status, b.reason)
        trial.details["compile_s"] = round(b.compile_s, 4)
        trial.details["resources"] = b.resources[sources[0]]
        if b.status != "ok":
            return done(b.status, b.reason)
        artifacts = b.artifacts
        if plan is not None:  # one binary serves every shape: kept against the spec's shape list
            artifacts = [artifacts[0]] * len(sp.op.all_shapes)
        # Parameters the template ignores for these shapes give the very same binaries and launches
        # as a configuration judged already: its verdict is this one's (no new information
        # would come from judging the same code again), and the worker's time goes elsewhere.
        bkey = self.builder.binary_key(artifacts, geometry)
        same = self.judged.get(bkey)
        if same is not None and same.id is not None and same.status in REUSABLE:
            trial.details["same_kernels_as"] = same.id
            trial.details.update({k: same.details[k] for k in INVARIANCE_DETAILS if k in same.details})
            if same.status != "ok":
                return done(same.status, f"the same kernels as trial #{same.id}: {same.reason}"[:2000])
            trial.times, trial.spreads = list(same.times), list(same.spreads or [])
            trial.details["shapes"] = same.details.get("shapes")
            trial.objective, trial.metric = same.objective, same.metric
            self.sources[trial.key], self.artifacts[trial.key] = sources, artifacts
            return done("ok")
        # a variant's error is held to the approved template's at the same parameters, run by the
        # worker on the same inputs (verify.paired_error): without that build, nothing holds it
        approved, why = self.builder.approved_artifacts(params, variant, shapes_built)
        if why:
            return done("forbidden", f"unjudged_precision: {why}; a variant is judged only where the approved "
                                     "template builds, since its error is held to that build's on the same inputs")
        if on_built is not None:
            on_built()
        # Fresh, unpredictable input seeds for every trial (recorded, so a verdict can be replayed).
        trial.details["seed"] = seed = secrets.randbits(48)
        job = {"seed": seed, "artifacts": artifacts, "geometry": geometry}
        if plan is not None:
            # the listed and tuning shapes it serves, timed; its extra shapes and shapes drawn
            # from the domain in secret (after the build), verified
            timed_idx, n_extra, shapes_job = plan
            trial.details["domain_seed"] = dseed = secrets.randbits(48)
            elem = sp.op.shape_env({})["elem"]
            draws = domain.draws(sp.op, lambda sh: sp.kernel.serves_shape(params, sh, elem), dseed)
            try:
                geometry = geometry + self.builder.geometry(params, draws)
            except ExprError as e:
                return done("render_error", f"launch geometry at a domain shape: {e}")
            job.update(shapes=shapes_job + draws, n_timed=len(timed_idx), geometry=geometry,
                       artifacts=[artifacts[0]] * (len(shapes_job) + len(draws)))
            trial.details["served"] = timed_idx
            trial.details["domain_checks"] = draws
        if approved is not None:  # with op.domain one binary serves every shape, the approved one too
            job["approved"] = approved if plan is None else [approved[0]] * len(job["artifacts"])
        if sp.op.batch_axis:
            why = self._invariance(trial, params, job)
            if why:
                return done("render_error", why)
        t_judge = time.perf_counter()
        verdict = self.worker.request(("evaluate", job), sp.runtime.timeout_s)
        trial.details["judge_wall_s"] = round(time.perf_counter() - t_judge, 4)
        if verdict.get("phases"):
            trial.details["judge_phases"] = verdict["phases"]
        if verdict.get("retried"):  # served a second time after the device ran out of memory (worker._serve)
            trial.details["judge_retried"] = verdict["retried"]
        if verdict.get("lean"):  # verification's widest lean of the error (verify.lean)
            trial.details["lean"] = verdict["lean"]
        if verdict.get("precision"):  # a variant's error against the approved build's (verify.paired_error)
            trial.details["precision"] = verdict["precision"]
        if verdict.get("log_capped"):  # the kernel printed past the worker log's cap; the rest was dropped
            trial.details["log_capped"] = verdict["log_capped"]
            trial.details["log_cap_bytes"] = verdict.get("log_cap_bytes")
            if verdict.get("printf_fifo_bytes"):  # and what one launch may print on the device
                trial.details["printf_fifo_bytes"] = verdict["printf_fifo_bytes"]
        if "persisting_l2_bytes" in verdict:  # L2 the runtime could not take back from persisting lines
            trial.details["persisting_l2_bytes"] = verdict["persisting_l2_bytes"]
        self.judged[bkey] = trial  # the worker's verdict on these binaries, whatever it is
        if verdict["status"] != "ok":
            return done(verdict["status"], verdict.get("reason", ""))
        bi = verdict.get("batch_invariance")
        if bi is not None:
            trial.details["batch_invariant"] = bi["invariant"]
            trial.details["batch_invariance"] = {k: v for k, v in bi.items() if k != "invariant"}
        trial.details["timed_calls"] = [s.get("n") for s in verdict["shapes"]]
        times = [s["median"] for s in verdict["shapes"]]
        spreads = [s["spread"] for s in verdict["shapes"]]
        clocks = [s.get("clock") for s in verdict["shapes"]]  # the SM clock and power over each timing
        if plan is not None:  # back onto the spec's timed shapes: None where it does not serve
            times, spreads = _spread_out(plan[0], times, len(sp.op.shapes)), \
                _spread_out(plan[0], spreads, len(sp.op.shapes))
            clocks = _spread_out(plan[0], clocks, len(sp.op.shapes))
        if any(clocks):
            trial.details["clocks"] = clocks
        shapes = self._score(trial, times, spreads)
        self.sources[trial.key] = sources
        self.artifacts[trial.key] = artifacts
        bad = figures.impossible(sp, shapes)
        if bad:
            return done("impossible", bad)
        return done("ok")

    def _invariance(self, trial: Trial, params: dict, job: dict) -> str | None:
        """op.batch_invariant: the sub-batch checks of this trial (judge/invariance.py), drawn from
        a seed of its own, drawn now (after the build) and recorded, and each sub-batch's launch
        geometry worked out for its shape (the binary is the shape's own: the template never
        reads the batch size). Puts them in the job; the reason where a geometry fails."""
        sp = self.spec
        op = sp.op
        shapes = job.get("shapes") or list(op.all_shapes)
        serves = None
        if op.domain:
            elem = op.shape_env({})["elem"]

            def serves(sh: dict) -> bool:
                return op.in_domain(sh) is None and sp.kernel.serves_shape(params, sh, elem)
        trial.details["batch_seed"] = seed = secrets.randbits(48)
        checks = invariance.plan(op.batch_axis, shapes, seed, serves)
        for c in checks:
            for sub in c["subs"]:
                try:
                    sub["geometry"] = self.builder.geometry(params, [sub["shape"]])[0]
                except ExprError as e:
                    return f"launch geometry at a sub-batch {sub['shape']} (op.batch_invariant): {e}"
        job["invariance"] = checks
        return None

    def _serves(self, params: dict) -> tuple[list[int], int, list[dict]]:
        """With op.domain: (indices of the timed shapes the configuration serves, how many extra
        shapes it serves, those timed shapes then those extra shapes)."""
        op, k = self.spec.op, self.spec.kernel
        elem = op.shape_env({})["elem"]
        timed = [i for i, s in enumerate(op.shapes) if k.serves_shape(params, s, elem)]
        extra = [s for s in op.extra_shapes if k.serves_shape(params, s, elem)]
        return timed, len(extra), [op.shapes[i] for i in timed] + extra

    def _score(self, trial: Trial, times: list, spreads: list) -> list[dict]:
        """Per-shape times into the trial's figures against this run's baseline; the per-shape figures.
        With op.domain a time is None where the configuration does not serve the shape; its
        objective is then the geomean of the dispatch it would make alone: its own time where
        it serves, the fallback's (the baseline) elsewhere."""
        trial.times, trial.spreads = times, spreads
        shapes = figures.per_shape(self.spec, times, self.baseline)
        trial.details["shapes"] = shapes
        trial.objective = figures.objective(times, self.baseline)
        trial.metric = figures.metric(self.spec, shapes)
        ms = figures.metric_spread(self.spec, shapes, spreads, self.baseline_spreads)
        if ms is not None:
            trial.details["metric_spread"] = round(ms, 4)
        return shapes

    def decide(self, cand: Trial, best: Trial | None) -> None:
        """Set cand.kept. The first correct trial is kept; later ones must win a paired re-timing."""
        if cand.status != "ok":
            return
        if "same_kernels_as" in cand.details:  # the original had its chance against the incumbent
            return
        if best is None:
            cand.kept = True
            return
        if cand.objective >= bar_of(best):
            return
        inc = self.artifacts.get(best.key)
        if inc is None:  # incumbent from an earlier session: compile it again (cached on disk)
            inc = self._rebuild(best)
            if inc is None:  # cannot pair them: keep only a clear win, and say so
                cand.kept = cand.objective < best.objective * (1 - REBUILD_MARGIN)
                cand.details["retime"] = {"status": "skipped", "reason": "the incumbent could not be rebuilt; "
                                          f"kept only if {REBUILD_MARGIN:.0%} faster by its own timing"}
                return
        only = None
        if self.spec.op.domain:  # paired on the shapes both serve; alone elsewhere (the fallback's there)
            only = [i for i, (a, b) in enumerate(zip(cand.times, best.times)) if a is not None and b is not None]
            if not only:
                cand.kept = cand.objective < best.objective * (1 - REBUILD_MARGIN)
                cand.details["retime"] = {"status": "skipped", "reason": "no timed shape served by both; kept "
                                          f"only if {REBUILD_MARGIN:.0%} faster by its own timing"}
                return
        shapes = None if only is None else [self.spec.op.shapes[i] for i in only]
        pick = (lambda xs: xs) if only is None else (lambda xs: [xs[i] for i in only])
        jobs = [{"artifacts": pick(self.artifacts[cand.key]), "geometry": self.builder.geometry(cand.params, shapes)},
                {"artifacts": pick(inc), "geometry": self.builder.geometry(best.params, shapes)}]
        t0 = time.time()
        ratios: list[float] = []
        verdict = "more"
        while verdict == "more":  # RETIME_ROUNDS rounds, then RETIME_MORE more where in doubt (keep_rule)
            rounds = RETIME_ROUNDS if not ratios else RETIME_MORE
            r = self.worker.request(("retime", jobs, rounds, secrets.randbits(48), 0.3, only),
                                    self.spec.runtime.timeout_s * rounds * 2)
            if r["status"] != "ok":
                cand.details["retime"] = {"status": r["status"], "reason": r.get("reason", "")}
                if r["status"] == "wrong" and r.get("job") == 0:  # right when checked, wrong when re-timed
                    cand.status, cand.reason = "wrong", r.get("reason", "")
                elif r["status"] == "wrong" and r.get("job") == 1 and r.get("charged"):
                    # the incumbent broke a rule of memory while its own calls alone ran (the
                    # candidate's bands or scratch, or its own): the record says so, and the
                    # candidate is not kept, nor wrong. Never kept in its place unpaired: a
                    # challenger that wrote what the incumbent reads (a value set's offsets, its
                    # module's globals, all in reach on a GPU) had the incumbent charged and was
                    # kept with no time compared (session 66's review)
                    cand.details["retime"]["incumbent_charged"] = best.id
                cand.wall_s += time.time() - t0
                return
            bad = _below_floor(self.spec, shapes, [c for c, _ in r["medians"]])
            if bad:  # the floor holds in every loop that times a candidate, not in evaluate's alone
                cand.status, cand.reason, cand.kept = "impossible", f"re-timed against the incumbent: {bad}", False
                cand.details["retime"] = {"status": "impossible", "reason": bad}
                cand.wall_s += time.time() - t0
                return
            ratios += [figures.geomean(c) / figures.geomean(i) for c, i in r["medians"]]
            verdict = keep_rule(ratios)
        cand.kept = verdict == "keep"
        med = statistics.median(ratios)
        cand.details["retime"] = {"ratios": [round(x, 4) for x in ratios], "median_ratio": round(med, 4),
                                  "wins": sum(x < 1 for x in ratios), "seconds": round(time.time() - t0, 3)}
        if cand.kept:  # the bar a later candidate must pass to be re-timed: the incumbent's, scaled by the pairing
            cand.details["bar_s"] = bar_of(best) * med
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
            geos.append(self.builder.geometry(t.params, [sp.op.shapes[i]])[0])
        jobs = [{"artifacts": arts, "geometry": geos}]
        paired = g.metric == "speedup" and sp.baseline != "none"
        if paired:
            jobs.append({"torch": sp.baseline})
        t0 = time.time()
        # each arm for the spec's whole timing budget, as pipe compare times it
        only = list(range(len(picks))) if sp.op.domain else None  # with op.domain: the listed shapes
        r = self.worker.request(("retime", jobs, rounds, secrets.randbits(48), 1.0, only),
                                sp.runtime.timeout_s * rounds * len(jobs))
        out = {"kernels": [t.id for t in picks], "rounds": rounds, "goal": g.describe(), "metric_name": g.metric,
               "judged_on": "lower quartile" if g.at_least is not None else "upper quartile",
               "against": sp.baseline if paired else None, "seconds": round(time.time() - t0, 3)}
        if r["status"] != "ok":
            return {**out, "met": False, "error": f"{r['status']}: {r.get('reason', '')}"[:500]}
        bad = _below_floor(sp, [sp.op.shapes[i] for i in only] if only is not None else None,
                           [row[0] for row in r["medians"]])
        if bad:
            return {**out, "met": False, "error": f"impossible: {bad}"}
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
        built = self.builder.rebuild(best.params, best.variant)
        if built is None:
            return None
        self.sources[best.key], arts = built
        return arts
