"""The autoresearch loop.

    propose → render → forbid → compile → verify → time → decide → record → stop?

`Session` holds what a run folder needs open (the ledger, the worker, the
evaluator, the baseline, the best so far) and judges one candidate at a time:
`pipe run` drives it with an agent, `pipe eval` with one candidate from the
command line, on the same folders. Each trial's row is committed before the
next trial starts. Re-running on the same folder resumes: finished trials are
never repeated (the loop drops proposals already in the ledger), an
interrupted trial is tried again, and budgets count everything the ledger holds.
"""

from __future__ import annotations

import difflib
import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .core import figures
from .core import log as logmod
from .core.figures import shape_label
from .core.records import Trial, split_key, trial_key, variant_id
from .judge.evaluator import Evaluator
from .judge.worker import Worker
from .ledger.ledger import Ledger, tsv, write_atomic
from .ledger.provenance import run_parts
from .core.errors import PipeError, RunDirError
from .ledger.rundir import BUSY, guard, lock_held, take_lock
from .ledger.summary import goal_by_text, goal_check_line, summarize
from .progress import Reporter
from .search.agents import Proposal, Seen, make_agent
from .search.core import (AHEAD, BROKEN_AFTER, DEEP, ahead_plan, broken_reason, goal_met, next_proposal,
                          stop_reason, untried)

EXIT_GOAL, EXIT_BUDGET, EXIT_INPUT = 0, 1, 2
BASELINE_SPREAD = 0.10  # a baseline whose interquartile spread is above this on a shape is timed again
BASELINE_TRIES = 3


@dataclass
class Outcome:
    exit_code: int
    stop: str
    best: Trial | None
    trials: int
    goal_check: dict | None = None  # the paired re-measurement behind a met goal (Session.confirm_goal)
    goal_check_shown: bool = False  # its line was printed as it was made (not so for one a resume read)

    def goal_by(self) -> str | None:
        """Which kernels met the goal, where they are not the best alone (summary.goal_by_text)."""
        return goal_by_text(self.goal_check, self.best.id) if self.best is not None else None


def steadier(kept: list[dict] | None, got: list[dict]) -> list[dict]:
    """Each shape's steadier timing of `kept` (None: none yet) and `got` (timing.stats dicts: the
    lower interquartile spread), so that one shape's noisy try does not stand for every shape."""
    return [g if k is None or g["spread"] < k["spread"] else k for k, g in zip(kept or [None] * len(got), got)]


class Session:
    """One open run folder: judge candidates, record them, keep the best."""

    def __init__(self, spec, run_dir: Path, keep_decisions: bool = True, force: bool = False,
                 scale: dict | None = None):
        self.spec = spec
        self.run_dir = run_dir
        self.keep_decisions = keep_decisions
        self.log = logmod.get().bind(run=str(run_dir))
        existed, fresh = run_dir.exists(), not (run_dir / "ledger.db").exists()
        self.ledger = Ledger.open(run_dir, spec.hash, spec.name, spec.path, run_parts(spec), spec.kernel.template)
        try:
            self._lock = _lock(run_dir)
        except BaseException:
            self.ledger.close()
            raise
        try:  # a ledger that fails its check is not resumed without --force (rundir.guard)
            self.check = guard(run_dir, self.ledger, force, "use this run folder")
        except BaseException:
            self.ledger.close()
            self._lock.close()
            raise
        if not self.check.intact:
            self.ledger.record_tampering(self.check)  # what was found stays found
        self.ledger.adopt_head()
        self.history = self.check.trials
        self._summary: dict | None = None  # run.json as last written; each trial updates its head
        # scale: {workers, gpus, ray, hw_check} (runner.scale): several judge workers (slots),
        # this process the one writer of the ledger; the first slot times the baseline
        self.slots = None
        if scale:
            from .scale.slots import make_slots

            try:
                self.slots = make_slots(spec, run_dir, **scale)
            except BaseException:
                self.ledger.close()
                self._lock.close()
                if fresh:  # (no cluster to reach, say) no stub folder left for `pipe runs` to list
                    _unmake(run_dir, existed)
                raise
        self.pool = None  # the slots' threads (_run_pool)
        self.inflight: dict[str, Proposal] = {}  # trial key -> its proposal, out on a slot
        self.worker = self.slots[0] if self.slots else Worker(spec, str(run_dir / "worker.log"))
        self.ev: Evaluator | None = None
        self.best: Trial | None = None
        self.agent = None  # set by run(): a pure agent lets the loop build its next proposal ahead
        # Building ahead compiles on the host while the worker judges. The CUDA judge times on the
        # device; a CPU judge times on the host, where compiles beside it would skew its timings,
        # so it builds ahead only when PIPE_BUILD_AHEAD=1 asks for it (and =0 turns it off).
        flag = os.environ.get("PIPE_BUILD_AHEAD", "")
        self.build_ahead = flag == "1" or (flag != "0" and spec.kernel.backend != "cpu")
        self._ahead: dict[str, Future] = {}  # trial key -> its build, started during a judge
        self._pool: ThreadPoolExecutor | None = None  # started by the first build ahead
        self._planner: ThreadPoolExecutor | None = None  # makes each plan of builds ahead
        self._plan: Future | None = None  # the plan being made during this judge
        self._ahead_lock = threading.Lock()
        self.reporter: Reporter | None = None
        self.goal_checks: dict[tuple, dict] = {}  # kernels (trial ids per shape) -> their goal check
        self.goal_check: dict | None = None  # the latest, for run.json and pipe show
        self.goal_check_shown = False  # the latest was printed as it was made (by this process)

    def start(self, reuse: dict | None = None) -> None:
        self.ev = Evaluator(self.spec, self.worker, self._baseline())
        base = json.loads(self.ledger.get_meta("baseline") or "null")
        if base and self.ev.baseline:
            self.ev.baseline_spreads = [s.get("spread", 0.0) for s in base["shapes"]]
        self.ev.builder.variants = {k: v["text"] for k, v in self.ledger.variants().items()}
        if reuse:
            self.ev.reuse = reuse
            self.log.info("run.reuse", verdicts=len(reuse))
        tried = {t.key for t in self.history}
        for key, n in self.ledger.interrupted().items():  # a trial that killed the runner twice is not retried
            if n >= 2 and key not in tried:
                params, variant = split_key(key)
                now = time.time()
                t = Trial(params=params, variant=variant, status="crashed", agent="runner", spec_hash=self.spec.hash,
                          reason=f"the runner died {n} times during this trial", started_at=now, finished_at=now)
                self.history.append(self.ledger.append(t))
        kept = [t for t in self.check.trusted(self.history) if t.kept]  # never a row after the damage
        self.best = kept[-1] if kept else None
        # the goal checks already made stand: a resumed run does not time the same kernels again
        # (checking until the noise says "met" would be a goal met by interrupting)
        for c in json.loads(self.ledger.get_meta("goal_checks") or "[]"):
            if isinstance(c, dict) and isinstance(c.get("kernels"), list) and "met" in c:
                self.goal_checks[tuple(c["kernels"])] = self.goal_check = c
                self.goal_check_shown = False
        self.write_outputs("running", None)

    def close(self) -> None:
        if self._planner is not None:
            self._planner.shutdown(wait=True, cancel_futures=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        for w in self.slots or [self.worker]:
            w.close()
        if self.pool is not None:
            self.pool.close()
        self.ledger.close()
        self._lock.close()

    @property
    def tried(self) -> set[str]:
        return {t.key for t in self.history} | set(self.inflight)

    def seen(self) -> list[Seen]:
        return [Seen(t.params, t.status, t.reason, t.objective, t.variant, t.metric,
                     tuple(t.times) if t.status == "ok" and t.times else None) for t in self.history]

    def register_variant(self, p: Proposal, agent: str) -> str | None:
        if p.variant is None:
            return None
        vid = variant_id(p.variant)
        if vid not in self.ev.builder.variants:
            parent_text, _ = self.ev.builder.template(p.parent if p.parent in self.ev.builder.variants else None)
            diff = "".join(difflib.unified_diff(parent_text.splitlines(True), p.variant.splitlines(True),
                                                p.parent or "template", vid))
            self.ledger.add_variant(vid, p.parent or "template", agent, p.variant, diff)
            self.ev.builder.variants[vid] = p.variant
        return vid

    def _build_ahead(self, p: Proposal, vid: str | None) -> None:
        """While the worker judges p, compile into the cache what the agent would propose next
        for the likeliest ways p may come out, and the proposal after the likeliest of those
        (ahead_plan), on AHEAD + DEEP threads in that order (so the plan's first build
        seldom waits behind a stale one still running). Only for agents whose proposals are a
        pure function of the history; a wrong guess costs CPU time beside the judge, never a
        verdict. The plan itself is made on a thread of its own (the agent's proposals take
        milliseconds that grow with the history), from a copy of what the agent may see, and
        is finished before the loop asks the agent anything else (judge waits for it)."""
        if not self.build_ahead or p.variant is not None or self.agent is None:
            return  # (no agent: pipe eval judges one candidate, nothing comes next)
        # the spec's start configurations still to come are the next trials, whatever the agent
        me = trial_key(dict(p.params), vid)
        starts = [dict(st) for st in self.spec.starts if trial_key(st) not in self.tried and trial_key(st) != me
                  and self.spec.space.contains(st) is None]
        if not starts and not getattr(self.agent, "pure", False):
            return
        if self._planner is None:
            self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plan-ahead")
        if starts:
            self._plan = self._planner.submit(self._submit_plan, starts[:AHEAD + DEEP])
            return
        args = (self.agent, self.seen(), list(self.history), dict(p.params), vid,
                self.best.objective if self.best else None, self.tried, self.spec.space)
        self._plan = self._planner.submit(self._submit_plan, None, *args)

    def _submit_plan(self, fixed: list[dict] | None, *args) -> None:
        """Start the builds of `fixed`, else of ahead_plan(*args), in that order. A build of the
        last plan that this one keeps is not started again; one it drops is cancelled if it has
        not started."""
        try:
            plan = fixed if fixed is not None else ahead_plan(*args)
            keys = [trial_key(g, None) for g in plan]
            with self._ahead_lock:
                for k in [k for k in self._ahead if k not in keys]:
                    self._ahead.pop(k).cancel()  # a running build finishes into the cache unwatched
                for k, g in zip(keys, plan):
                    if k not in self._ahead:
                        if self._pool is None:
                            self._pool = ThreadPoolExecutor(max_workers=AHEAD + DEEP,
                                                            thread_name_prefix="build-ahead")
                        self._ahead[k] = self._pool.submit(self._quiet_prebuild, g)
        except Exception as e:  # a guess is never worth a failed run
            self.log.debug("build_ahead.failed", error=repr(e))

    def _plan_done(self) -> None:
        if self._plan is not None:
            self._plan.result()
            self._plan = None

    def _quiet_prebuild(self, params: dict) -> None:
        try:
            self.ev.builder.prebuild(params)
        except Exception:
            pass  # the trial, if it comes, builds and reports for itself

    def judge(self, p: Proposal, agent: str) -> Trial:
        vid = self.register_variant(p, agent)
        key = trial_key(dict(p.params), vid)
        self.ledger.begin(key)
        # a build ahead of this trial: wait for it if it started (its compiles land in the
        # cache), else drop it and build here; the other guesses stay queued for the next plan
        # (the last judge waited for the plan that made them)
        with self._ahead_lock:
            f = self._ahead.pop(key, None)
        prebuilt = f is not None and not f.cancel()
        t0 = time.perf_counter()
        if prebuilt:
            f.result()
        waited = time.perf_counter() - t0
        t = self.ev.run(dict(p.params), agent, vid, on_built=lambda: self._build_ahead(p, vid))
        self._plan_done()  # the agent is asked nothing else while it plans
        if prebuilt:
            t.details["built_ahead"] = True
            t.details["ahead_wait_s"] = round(waited, 4)
        if p.note:
            t.details["note"] = p.note[:2000]
        if self.keep_decisions:
            self.ev.decide(t, self.best)
        return self.record_trial(t)

    def record_trial(self, t: Trial) -> Trial:
        """Append a judged trial (this process is the ledger's one writer), then trials.tsv,
        the best and run.json's head."""
        if not self.keep_decisions and t.status == "ok" and (self.best is None or t.objective < self.best.objective):
            t.kept = True  # recording a space: the fastest so far, without paired re-timing
        t = self.ledger.append(t)
        self.history.append(t)
        if t.kept:
            self.best = t
            self.write_best()
        self.log.debug("trial.done", id=t.id, status=t.status, params=t.params, variant=t.variant,
                       objective=t.objective, kept=t.kept, reason=t.reason or None)
        with open(self.run_dir / "trials.tsv", "a", encoding="utf-8") as f:
            f.write(tsv([t], [shape_label(s) for s in self.spec.op.shapes]).split("\n", 1)[1])
        if self._summary is not None:  # run.json anchors the ledger's head after every row
            self._summary["ledger_head"] = {"rows": t.id, "chain": t.chain}
            write_atomic(self.run_dir / "run.json", json.dumps(self._summary, indent=2, default=str) + "\n")
        return t

    def confirm_goal(self, picks: list[Trial]) -> bool:
        """Whether `picks` (one trial per timed shape) meet the goal when measured again in
        paired rounds against the baseline (Evaluator.confirm_goal); once per set of kernels."""
        key = tuple(t.id for t in picks)
        if key not in self.goal_checks:
            c = self.ev.confirm_goal(picks)
            self.goal_checks[key] = self.goal_check = c
            checks = json.loads(self.ledger.get_meta("goal_checks") or "[]")
            self.ledger.set_meta("goal_checks", json.dumps([*checks, {**c, "at_trial": len(self.history)}]))
            self.log.info("goal.check", **{k: v for k, v in c.items() if k != "values"})
            if self.reporter is not None:
                self.reporter.line(goal_check_line(self.spec, c))
                self.goal_check_shown = not self.reporter.quiet
        return self.goal_checks[key]["met"]

    def _baseline(self) -> list[float] | None:
        spec = self.spec
        if not self.ledger.get_meta("reference_checked"):
            # the reference at the shapes no baseline timing calls it on (every one with none), else
            # at the smallest listed one: the baseline calls it in the inputs' own dtypes, never on
            # the float64 copies verification gives it (a float32 answer there: check_reference)
            extra_only, smallest = (False, False) if spec.baseline == "none" else \
                (True, False) if spec.op.extra_shapes else (False, True)
            got = self.worker.request(("check_reference", extra_only, smallest), spec.runtime.timeout_s * 10)
            if got["status"] != "ok":
                raise self._reference_failed(f"op.reference {spec.op.reference}", got)
            self.ledger.set_meta("reference_checked", "1")
        if spec.baseline == "none":
            return None
        have = self.ledger.get_meta("baseline")
        if have:
            return json.loads(have)["times"]
        r, tries, steadiest = None, 0, None
        # A noisy baseline makes every speedup noisy: timed again while a shape's spread is large
        # (BASELINE_SPREAD), up to BASELINE_TRIES times, and each shape keeps its steadiest timing
        # (a whole timing's steadiest kept a shape at 11.5 ms, +-134%, against 0.18 ms the try
        # before: a first figure of 27x where the kernel was 2x slower than torch; session 55's
        # first-hour trial, on a loaded machine)
        while tries < BASELINE_TRIES:
            tries += 1
            got = self.worker.request(("baseline", spec.baseline), spec.runtime.timeout_s * 10)
            if got["status"] != "ok":
                self.log.warning("baseline.failed", reason=got.get("reason"))
                # the reference (or its compiled form) fails on the spec's own shapes: every trial
                # is verified against it, so no trial could pass; stop here and say so
                what = f"op.reference {spec.op.reference}" + (" under torch.compile" if spec.baseline == "compile" else "")
                raise self._reference_failed(what, got)
            r = r or got
            steadiest = steadier(steadiest, got["shapes"])
            if max(sh["spread"] for sh in steadiest) <= BASELINE_SPREAD:
                break
        times = [sh["median"] for sh in steadiest]
        noisy = [i for i, sh in enumerate(steadiest) if sh["spread"] > BASELINE_SPREAD]
        self.ledger.set_meta("baseline", json.dumps({"mode": spec.baseline, "times": times, "shapes": steadiest,
                                                     "timings": tries, **({"noisy": noisy} if noisy else {}),
                                                     **({"heap": r["heap"]} if r.get("heap") else {})}))
        self.log.info("baseline.done", mode=spec.baseline, times_us=[round(t * 1e6, 3) for t in times])
        if noisy:  # said where the run is watched (the log's console lines): every speedup over it carries it
            worst = max(steadiest[i]["spread"] for i in noisy)
            self.log.warning("baseline.noisy", shapes=noisy, spread=round(worst, 3), timings=tries,
                             note="speedups over these shapes carry that spread; the goal check re-times "
                                  "the baseline beside the kernel in paired rounds")
        return times

    def _reference_failed(self, what: str, got: dict) -> PipeError:
        """The error for a reference that fails on the spec's own shapes (every trial is verified
        against it, so none could pass), at op.reference's line of the spec."""
        where = self.spec.path
        try:
            from .spec import yamlsrc

            line, col = yamlsrc.load_file(self.spec.path).pos(("op", "reference"))
            where = f"{where}:{line}:{col}"
        except (PipeError, OSError):  # the file changed or went since the run loaded it
            pass
        return PipeError(f"{where}: {what} failed on the spec's shapes before any trial "
                         f"({got.get('status')}): {str(got.get('reason', ''))[:500]}")

    def write_best(self) -> None:
        best, d = self.best, self.run_dir / "best"
        d.mkdir(exist_ok=True)
        for old in d.glob("*"):  # files of an earlier best (per-shape sources, a variant) must not linger
            if old.name != "params.json":
                old.unlink()
        sources = self.ev.sources.get(best.key) or self.ev.builder.render_all(best.params, best.variant)
        ext = ".cu" if self.spec.kernel.backend == "cuda" else ".cpp"
        unique = list(dict.fromkeys(sources))
        for src in unique:
            name = f"kernel{ext}" if len(unique) == 1 else f"kernel.shape{sources.index(src)}{ext}"
            write_atomic(d / name, src)
        if best.variant:
            write_atomic(d / "template.j2", self.ev.builder.variants[best.variant])
        write_atomic(d / "params.json", json.dumps(
            {"trial": best.id, "params": best.params, "variant": best.variant, "objective_s": best.objective,
             "metric": best.metric, "times_s": best.times, "shapes": self.spec.op.shapes,
             "source_hash": best.source_hash}, indent=2) + "\n")

    def write_outputs(self, status: str, stop: str | None) -> None:
        spec = self.spec
        write_atomic(self.run_dir / "trials.tsv", tsv(self.history, [shape_label(s) for s in spec.op.shapes]))
        if self.best is not None and _best_on_disk(self.run_dir) != self.best.id:
            self.write_best()  # a kill between the ledger commit and write_best left it stale
        check = self.ledger.verify()  # the chain and the ledger's own head (and damage recorded by --force)
        summary = summarize(spec.name, spec.path, spec.hash, self.ledger, self.history, status, stop,
                            spec.goal.describe(),
                            figures.table_metric(spec, check.trusted(self.history),
                                                 self.ev.baseline if self.ev is not None else None), check=check,
                            goal_check=self.goal_check)
        summary["ledger_head"] = self.ledger.head()
        # a limit from a profile's upper bound (the host CPU's), not a measurement: pipe show says so
        summary["limit_measured"] = bool(spec.hw.bandwidth_measured)
        write_atomic(self.run_dir / "run.json", json.dumps(summary, indent=2, default=str) + "\n")
        self._summary = summary


def run(spec, run_dir: Path, max_trials: int | None = None, minutes: float | None = None,
        reporter: Reporter | None = None, keep_decisions: bool = True,
        call_minutes: float | None = None, reuse: dict | None = None, force: bool = False,
        scale: dict | None = None) -> Outcome:
    """`minutes` budgets the run's whole time, resumed trials included; `call_minutes` this
    call's alone (pipe record's slices). `reuse`: an earlier run's verdicts that stand for
    this spec (judge.reuse.reusable_verdicts). `scale`: judge on several workers
    (runner.scale.slots.make_slots's arguments; _run_pool)."""
    budget_trials = max_trials or spec.goal.trials
    budget_s = (minutes or spec.goal.minutes or 0) * 60 or None
    reporter = reporter or Reporter(budget_trials)
    s = Session(spec, run_dir, keep_decisions, force, scale)
    s.reporter = reporter
    s.log.info("run.start", spec=spec.path, spec_hash=spec.hash, resumed_trials=len(s.history),
               agent=spec.agent.strategy, goal=spec.goal.describe())
    try:
        agent = s.agent = make_agent(spec.agent.strategy, spec.space, spec.agent.seed, spec.agent.options,
                                     brief=brief(spec))
        if hasattr(agent, "prepare"):  # a command agent: confined before it runs (search/agents/confine.py)
            from .build.backends import cache_dir
            from .search.agents import confine

            try:
                said = agent.prepare(confine.owned_paths(spec, run_dir, cache_dir()))
            except PipeError as e:
                raise type(e)(f"{spec.path}: {e}") from None
            s.log.info("agent.confinement", confined=agent.jail is not None, detail=said)
        s.start(reuse)
        session_t0 = time.time()
        elapsed_before = sum(t.wall_s for t in s.history)
        confirm = s.confirm_goal
        if s.slots:
            stop, confirm = _run_pool(spec, agent, s, reporter, budget_trials, budget_s, call_minutes,
                                      session_t0, elapsed_before)
        while not s.slots:
            stop = stop_reason(spec, s.history, s.best, budget_trials, budget_s,
                                elapsed_before + time.time() - session_t0, call_minutes, time.time() - session_t0,
                                s.ev.baseline, s.confirm_goal)
            if stop:
                break
            cand = _next(spec, agent, s)
            if cand is None:
                stop = "space exhausted"
                break
            t = s.judge(cand, agent.name)
            reporter.trial(t, s.best, len(s.history))
            _warn_broken(s, reporter)
        met = goal_met(spec, s.history, s.best, s.ev.baseline, confirm)
        s.write_outputs("goal met" if met else stop, stop)
        s.log.info("run.end", stop=stop, trials=len(s.history), best_id=s.best.id if s.best else None,
                   best_objective_s=s.best.objective if s.best else None, goal_met=met)
        return Outcome(EXIT_GOAL if met else EXIT_BUDGET, stop, s.best, len(s.history), s.goal_check,
                       s.goal_check_shown)
    except PipeError as e:
        # a run that stops on an error (its reference fails before any trial, say) says so in
        # run.json: `failed`, with the reason, where it would read as `interrupted`
        try:
            s.write_outputs("failed", str(e).splitlines()[0][:500] if str(e) else type(e).__name__)
        except Exception as w:  # the error that stopped the run is the one to report
            s.log.warning("run.failed_not_recorded", reason=f"{type(w).__name__}: {w}")
        raise
    finally:
        _drain(agent if "agent" in locals() else None, s)
        reporter.close()
        s.close()


def _drain(agent, s: Session) -> None:
    """Write what a context-reading agent exchanged (replies, feedback) into the ledger."""
    for ev in getattr(agent, "drain", lambda: [])():
        s.ledger.add_reply(ev["agent"], ev["outcome"], ev["reply"], ev["feedback"])


def brief(spec) -> dict:
    """What context-reading agents may know: never the spec file, the judge or the ledger."""
    forb = [f for f in spec.raw.get("forbidden", [])]
    return {
        "op": {"name": spec.name, "description": spec.description, "notes": spec.op.notes, "dtype": spec.op.dtype,
               "shapes": list(spec.op.shapes), "extra_shapes": list(spec.op.extra_shapes),
               "bytes": spec.op.bytes.text, "flops": spec.op.flops.text if spec.op.flops else None},
        "hardware": {"name": spec.hw.name, "notes": spec.hw.context},
        "forbidden": forb,
        "space": {"params": {p.name: list(p.values) for p in spec.space.params},
                  "constraints": [c.text for c in spec.space.constraints]},
        "template": spec.kernel.template,
        # kernel.scratch: workspaces the runner passes (zero before the first call; the kernel
        # must leave them zero after every call, checked as its outputs are)
        **({"scratch": {s.name: {"shape": [d.text for d in s.shape], "dtype": s.dtype,
                                 "rule": "zero when the kernel is called; the kernel must leave it zero"}
                        for s in spec.kernel.scratch}} if spec.kernel.scratch else {}),
        # kernel.tensor_maps: TMA descriptors the runner builds on an op tensor and passes by value
        **({"tensor_maps": {m.name: {"tensor": m.tensor, "box": [d.text for d in m.box], "swizzle": m.swizzle,
                                     **({"when": m.when.text} if m.when is not None else {}),
                                     "rule": "a CUtensorMap (128 bytes) of the tensor, box outermost first; "
                                             "coordinates innermost first; outside the tensor reads zero"
                                             + ("; where `when` does not hold, a placeholder the kernel must "
                                                "not read" if m.when is not None else "")}
                            for m in spec.kernel.tensor_maps}} if spec.kernel.tensor_maps else {}),
        # op.batch_invariant: the judge compares each row's output alone and in other batches
        **({"batch_invariant": {
            "axis": spec.op.batch_axis, "required": spec.op.batch_required,
            "rule": "each row's output must be bitwise the same run to run and in any batch (alone, reordered, "
                    "among other rows); " + ("a kernel that is not is wrong" if spec.op.batch_required else
                                             "recorded per trial, and the exported op's deterministic mode uses "
                                             "only the kernels that are")}} if spec.op.batch_axis else {}),
        "goal": spec.goal.describe(),
        "budget": {"trials": spec.goal.trials, "minutes": spec.goal.minutes},
    }


def _next(spec, agent, s: Session) -> Proposal | None:
    # every reply of a context-reading agent is in the ledger before its trial runs
    return next_proposal(agent, s.seen, s.tried, spec.space, _owed(spec, s), after_ask=lambda: _drain(agent, s))


# The driver starts the plan of builds ahead once a slot's trial is built, or after this long (a
# trial compiled from scratch takes seconds: the other slots' proposals do not wait for it)
BUILT_WAIT_S = 0.25


def _warn_broken(s: Session, reporter) -> None:
    """Once, as the BROKEN_AFTER-th trial is recorded, if the first ones all failed to compile
    alike (search.core.broken_reason): a warning line, and the run goes on (a sweep, pipe
    record, says nothing)."""
    why = broken_reason(s.history) if s.keep_decisions and len(s.history) == BROKEN_AFTER else None
    if why:
        reporter.line(f"warning: {why}")
        if reporter.quiet or logmod.for_machines():  # else the line above is the console's one copy
            s.log.warning("template.may_not_build", reason=why)


def _run_pool(spec, agent, s: Session, reporter, budget_trials, budget_s, call_minutes, session_t0,
              elapsed_before) -> tuple[str, object]:
    """The loop over several slots (runner.scale): the free slots are filled with the agent's
    proposals (asked for as many as are in flight and free), each slot's thread builds (the
    one compile cache is shared) and judges on its own worker, and this thread, the ledger's
    one writer, records the trials in the order they complete, each with its slot. A keep
    decision's paired re-timing runs on the slot that timed the candidate, against the
    incumbent timed there too; when another trial became the best meanwhile, the candidate
    is decided again against that one. A trial whose worker was lost (killed from outside,
    a Ray actor or node gone) is given to another slot; lost twice, it is a `fault`. The
    trials in flight are in the ledger's attempts: a runner killed with trials in flight
    retries them on resume. Returns (why it stopped, the goal check to use at the end)."""
    import copy

    from .scale.pool import Pool
    from .scale.slots import SlotLost

    pool = s.pool = Pool(s.slots)
    evs = {}
    for sl in s.slots:
        e = copy.copy(s.ev)  # the builder, its cache and what was judged are shared; the worker is the slot
        e.worker = sl
        evs[sl.name] = e
    retry: list[Proposal] = []
    pending: list[Proposal] = []  # an exclusive agent's other proposals of its last reply
    lost: dict[str, list[str]] = {}  # trial key -> why its workers were lost
    begun: set[str] = set()

    def confirm(picks):  # a goal check runs on a free slot, from this thread, while nothing else uses it
        key = tuple(t.id for t in picks)
        if key in s.goal_checks:
            return s.goal_checks[key]["met"]
        free = pool.free()
        if not free:
            return False  # asked again once a slot is free
        s.ev.worker = free[0]
        try:
            return s.confirm_goal(picks)
        except SlotLost as e:  # asked again on another slot
            s.log.warning("slot.lost", slot=free[0].name, gone=free[0].gone, during="goal check", reason=str(e))
            return False
        finally:
            s.ev.worker = s.worker

    def record(t: Trial, key: str) -> None:
        t = s.record_trial(t)
        s.inflight.pop(key, None)
        reporter.trial(t, s.best, len(s.history))
        _warn_broken(s, reporter)

    def decide(t: Trial, key: str, slot) -> None:
        best = s.best

        def go(sl):
            evs[sl.name].decide(t, best)
            return best
        pool.submit(slot, "decide", (t, key), go)

    stop = None
    while True:
        if stop is None:
            stop = stop_reason(spec, s.history, s.best, budget_trials, budget_s,
                               elapsed_before + time.time() - session_t0, call_minutes, time.time() - session_t0,
                               s.ev.baseline, confirm)
        while stop is None and pool.free() and (budget_trials is None or
                                                len(s.history) + len(pool.busy) < budget_trials):
            free = pool.free()
            s._plan_done()  # the agent is asked nothing while a plan of builds ahead reads it
            while pending and not untried(pending[0], s.tried, spec.space):
                pending.pop(0)
            exclusive = getattr(agent, "exclusive", False)
            if not retry and not pending and pool.busy and exclusive:
                # a command agent's process runs only while no slot judges: beside a timing it
                # could time its own load to a rival's rounds (it sees the judge's processes in
                # /proc: session 42's third red team). It is asked for every slot at once instead,
                # and the reply's other proposals fill the other slots
                break
            if retry:
                p = retry.pop(0)
            elif pending:
                p = pending.pop(0)
            else:
                p = next_proposal(agent, s.seen, s.tried, spec.space, _owed(spec, s),
                                  after_ask=lambda: _drain(agent, s), n=len(pool.busy) + len(free),
                                  rest=pending if exclusive else None)
                if p is None:
                    break
            vid = s.register_variant(p, agent.name)
            key = trial_key(dict(p.params), vid)
            where = [sl for sl in free if not any(sl.name in w for w in lost.get(key, []))] or free
            s.inflight[key] = p
            if key not in begun:  # a retry after a lost worker is the same attempt
                s.ledger.begin(key)
                begun.add(key)
            with s._ahead_lock:  # taken before the next plan, which drops the builds it does not name
                f = s._ahead.pop(key, None)
            built = threading.Event()
            pool.submit(where[0], "run", (p, key),
                        lambda sl, p=p, vid=vid, f=f, built=built: _run_built_ahead(evs[sl.name], p, agent.name, vid,
                                                                                   f, built))
            # compile what comes next while the slots judge, as the one-worker loop does (a
            # wrong guess costs host CPU time, never a verdict), once this trial is built: a plan
            # started beside the slot's build takes the interpreter from it (on one GPU that
            # build grew from 1 to 40 ms a trial, and the trial rate fell by 9%)
            built.wait(BUILT_WAIT_S)
            s._build_ahead(p, vid)
        if not pool.busy:
            if not pool.alive():
                raise RunDirError("every judge worker of this run is gone; the trials in flight are retried "
                                  "when the run is resumed")
            if stop is None:
                stop = "space exhausted"
            break
        d = pool.wait()
        if d.error is not None and not isinstance(d.error, SlotLost):
            raise d.error
        if d.kind == "run":
            p, key = d.tag
            if d.error is not None:
                why = str(d.error)
                lost.setdefault(key, []).append(why)
                s.log.warning("slot.lost", slot=d.slot.name, gone=d.slot.gone, params=dict(p.params), reason=why)
                if len(lost[key]) < 2:
                    retry.append(p)
                    continue
                now = time.time()
                t = Trial(params=dict(p.params), variant=trial_key_variant(key), status="fault", agent=agent.name,
                          spec_hash=spec.hash, reason=f"the worker died twice during this trial: {why}"[:2000],
                          started_at=now, finished_at=now)
                t.details["lost"] = lost[key]
                record(t, key)
                continue
            t = d.result
            t.details["slot"] = d.slot.name
            if key in lost:
                t.details["retried_after"] = lost[key]
            if p.note:
                t.details["note"] = p.note[:2000]
            if s.keep_decisions and _needs_retime(t, s.best):
                decide(t, key, d.slot)
                continue
            if s.keep_decisions:
                s.ev.decide(t, s.best)  # no worker needed: not ok, the same kernels, the first, or slower
            record(t, key)
        else:
            t, key = d.tag
            if d.error is not None:
                t.kept = False
                t.details["retime"] = {"status": "lost", "reason": str(d.error)[:500]}
            elif d.result is not s.best and t.kept:  # another trial became the best meanwhile
                t.kept = False
                t.details["retime_before"] = t.details.pop("retime", None)
                if _needs_retime(t, s.best):
                    decide(t, key, d.slot)
                    continue
            record(t, key)
    s._plan_done()
    return stop, confirm


def _run_built_ahead(ev, p: Proposal, agent: str, vid: str | None, f: Future | None,
                     built: threading.Event) -> Trial:
    """A slot's trial: wait for its build ahead `f` if it started (its compiles land in the
    shared cache), as Session.judge does, then judge it on the slot's worker. `built` is set
    once the trial is built (or judged without a build: a verdict before it, or an error)."""
    prebuilt = f is not None and not f.cancel()
    t0 = time.perf_counter()
    try:
        if prebuilt:
            f.result()
        waited = time.perf_counter() - t0
        t = ev.run(dict(p.params), agent, vid, on_built=built.set)
    finally:
        built.set()
    if prebuilt:
        t.details["built_ahead"] = True
        t.details["ahead_wait_s"] = round(waited, 4)
    return t


def trial_key_variant(key: str) -> str | None:
    return split_key(key)[1]


def _needs_retime(t: Trial, best: Trial | None) -> bool:
    """Whether Evaluator.decide re-times `t` against `best` (a worker's request): the same test
    as decide's, against best's bar (evaluator.bar_of)."""
    from .judge.evaluator import bar_of

    return (t.status == "ok" and "same_kernels_as" not in t.details and best is not None
            and t.objective is not None and t.objective < bar_of(best))


def _owed(spec, s: Session):
    for st in spec.starts:  # the spec's start configurations first, in order (those of its space)
        yield Proposal(dict(st))
    for key, n in s.ledger.interrupted().items():  # a trial that was in flight when the runner died
        if n < 2:
            params, variant = split_key(key)
            if variant is None or variant in s.ev.builder.variants:
                text = s.ev.builder.variants.get(variant) if variant else None
                yield Proposal(params, text, note="retried: the runner died during this trial")


def check_scale(spec, workers: int | None, gpus: str | None, ray: str | None) -> None:
    """--workers, --gpus, --ray refused before the run folder is touched (PipeError)."""
    from .scale.slots import precheck

    precheck(spec, workers, gpus, ray)


def check_free(run_dir: str | None, spec_path: str, suffix: str = "") -> None:
    """Refuse a busy run folder at once, before the spec is loaded (which imports torch). The
    default folder is runs/<the spec's name><suffix>; a spec that does not parse is left to the
    full load, which reports it."""
    if run_dir is None:
        from .spec import yamlsrc

        try:
            name = yamlsrc.load_file(spec_path).data.get("name")
        except Exception:
            return
        if not isinstance(name, str):
            return
        run_dir = str(Path("runs") / f"{name}{suffix}")
    if lock_held(Path(run_dir)):
        raise RunDirError(BUSY.format(run_dir))


def _unmake(run_dir: Path, existed: bool) -> None:
    """Take back what opening a new run folder made (its ledger and lock, and the folder if this
    call made it and nothing else is in it); never anything else in it."""
    for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm", "ledger.db-journal", ".lock"):
        try:
            (run_dir / name).unlink()
        except OSError:
            pass
    if not existed:
        try:
            run_dir.rmdir()  # only if empty
        except OSError:
            pass


def _lock(run_dir: Path):
    """One process at a time per run folder (pipe run and pipe eval alike)."""
    return take_lock(run_dir)


def _best_on_disk(run_dir: Path) -> int | None:
    try:
        return json.loads((run_dir / "best" / "params.json").read_text())["trial"]
    except (OSError, ValueError, KeyError):
        return None


def check_hardware(spec, match: bool = True) -> None:
    """A CUDA spec finds a GPU here and (`match`) it matches the spec's hardware profile
    (PipeError if not)."""
    from .spec import hw

    hw.check_present_device(spec.hw, match)


def _finished(run_dir: Path) -> tuple[str, str | None] | None:
    """(status, stop) of run.json where a run there ended (not running, not an eval), else None."""
    try:
        doc = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    st = doc.get("status") if isinstance(doc, dict) else None
    return (st, doc.get("stop")) if isinstance(st, str) and st not in ("running", "eval") else None


def eval_one(spec, run_dir: Path, params: dict, variant: str | None, force: bool = False) -> tuple[Trial, bool]:
    """pipe eval: judge one candidate (a variant's whole template text, or None) with the
    full judge and append it to the run's ledger; (its trial, whether the ledger held it
    already)."""
    s = Session(spec, run_dir, force=force)
    try:
        before = _finished(run_dir)  # a finished run's status and stop stand: one trial more is no new end
        s.start()
        key = trial_key(params, variant_id(variant) if variant is not None else None)
        old = next((t for t in s.history if t.key == key), None)
        t = old or s.judge(Proposal(params, variant), "eval")
        s.write_outputs(*(before or ("eval", None)))
    finally:
        s.close()
    return t, old is not None


RECORDED_TO = "dataset.path"  # in a sweep's run folder: the dataset file it writes (pipe record)


def recorded_to(run_dir: Path) -> Path | None:
    """The dataset file a sweep's run folder wrote last, or None."""
    try:
        return Path((run_dir / RECORDED_TO).read_text(encoding="utf-8").strip())
    except OSError:
        return None


def record(spec, run_dir: Path, dest: Path, reuse_from: Path | None = None, minutes: float | None = None,
           quiet: bool = False, force: bool = False, on_reuse=None, scale: dict | None = None) -> dict:
    """pipe record: sweep the whole space (spec.spec.sweep) in `run_dir`, taking the verdicts
    of `reuse_from` that stand for these kernels (judge.reuse), and write what the ledger holds
    as a replay dataset to `dest`. Returns the counts pipe record prints."""
    from .judge.reuse import reusable_verdicts
    from .search import dataset
    from .spec.spec import sweep as sweep_spec

    sweep = sweep_spec(spec)
    n = sweep.goal.trials
    reuse = None
    if reuse_from is not None:
        reuse = reusable_verdicts(sweep, reuse_from, force)  # checked before the sweep's folder is made
        if on_reuse is not None:
            on_reuse(len(reuse))
    out = run(sweep, run_dir, reporter=Reporter(n, quiet=quiet), keep_decisions=False, call_minutes=minutes,
              reuse=reuse, force=force, scale=scale)
    led = Ledger.read(run_dir)
    try:
        data = dataset.export(spec, led.trials())
    finally:
        led.close()
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(dataset.dumps(data))
    write_atomic(run_dir / RECORDED_TO, str(dest.resolve()) + "\n")  # whose dataset a resumed sweep rewrites
    by: dict[str, int] = {}
    for t in data["trials"]:
        by[t["status"]] = by.get(t["status"], 0) + 1
    return {"size": n, "trials": out.trials, "recorded": len(data["trials"]), "by_status": by,
            "reused": sum(1 for t in data["trials"] if "reused_from" in t)}


def recorded_goal_check_line(spec_path: str | None, c: dict) -> str:
    """pipe show's line for a recorded goal check: goal_check_line, with the spec's words for a
    check recorded before checks carried their own."""
    from .spec.spec import load_spec

    try:
        spec = None if c.get("goal") else load_spec(spec_path)
        return goal_check_line(spec, c)
    except Exception:  # an older check, and the spec moved: its figures without its words
        return f"goal check: {json.dumps({k: c.get(k) for k in ('met', 'metric', 'low', 'high', 'rounds')})}"
