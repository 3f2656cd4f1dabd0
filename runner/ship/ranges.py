"""Dispatch by range (op.domain): from timed points to a table that serves every size.

`pipe compare` on a spec with a domain does four things, in one worker:

1. **The points.** At every tuning point (and named shape) it times side by side the
   `top` fastest configurations the run recorded there and torch eager, in rounds that
   alternate the order. A point's choices are the kernels that beat torch eager there by
   more than NOISE (else it takes the fallback, torch), fastest first by the even rounds:
   where two or more ran, by their times at a size of the point's range drawn in secret
   (the point itself is public). Where the point stands for a range, the fallback's time
   is its mean over the point and its TWINS next sizes.
2. **The boundaries.** Along a range axis, each stretch between two neighbouring points
   belongs to the nearer one (log scale) until measured: where the two points choose
   differently, the two contenders (a kernel or the fallback) are timed against each
   other at a size drawn in secret in the middle of the stretch, and the boundary
   moves by bisection, REFINE times. Each
   range keeps an ordered list of kernels (its own point's choices, then its
   neighbours'): a shape takes the first whose `kernel.serves` holds for it, else the
   fallback. Where the kernel that takes a range's low end stops serving inside it (a
   bucket's largest row), the range is cut there and the part above gets lists measured
   at its own log-midpoint, so no stretch of the axis goes to a kernel by list order alone.
3. **The check.** Every kernel the table lists is verified (not timed) at up to SWEEP sizes
   of each range that lists it (judge/domain.sweep); one wrong anywhere leaves the table, as
   does one the curve below finds wrong at a secret point (`verify_table`, `drop`).
4. **The curve.** At points of the domain nobody tuned on, drawn in secret (two thirds over
   the whole domain, the rest inside ranges those left without a point, so a short range
   the cut made is judged too), it times the table's choice against torch eager,
   torch.compile (dynamic shapes), the spec's Triton kernel and a device copy of the op's
   bytes, and reports the table's regret against the best arm at each point.

Tables over one range axis are refined by bisection; with several axes each point owns its
box of the product grid (midpoints on every axis), and each box is cut in two on every axis,
its parts measured at their own centres (`_split_boxes`). Every size timed (the points, the
midpoints of a bisection, the curve's) lies inside op.domain_where; the grid has no point
outside it (nor a box of its own there), and the exported op takes the fallback outside it.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import secrets
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Callable, NamedTuple

from ..judge.domain import _edge, wide_rows
from ..spec.spec import ROWS_CAP

NOISE = 0.02  # a kernel must beat torch eager by more than this to be chosen at a point
REFINE = 3  # bisection steps per boundary
CURVE_POINTS = 24  # secret points of the curve
# Sizes next to a point where the fallback is timed again. A library kernel's speed can jump
# between neighbouring sizes (torch's masked SDPA read 4.23 TB/s at one decode part's centre and
# 2.70 at a size of the same part: its path may depend on how the sizes align), where a tuned
# kernel's does not; so a range's fallback is judged by its mean time over the point and the
# next TWINS sizes along the largest axis (four sizes: every residue mod 4 once), the time it
# takes at a size of the range drawn at random, not by the point alone.
TWINS = 3


def _split(rounds: list[float]) -> tuple[float | None, float | None]:
    """(even rounds' median: to choose; odd rounds' median: to report)."""
    if not rounds:
        return None, None
    pick = statistics.median(rounds[0::2])
    return pick, (statistics.median(rounds[1::2]) if len(rounds) > 1 else pick)


def _geo_mid(a: int, b: int) -> int:
    return int(round(math.sqrt(a * b)))


MID_TRIES = 8


def _secret_mid(a: int, b: int, rng: random.Random) -> int:
    """A value drawn in secret in the middle half of [a, b] on a log scale."""
    la, lb = math.log(max(a, 1)), math.log(max(b, 1))
    return int(round(math.exp(rng.uniform(la + (lb - la) / 4, lb - (lb - la) / 4))))


class Prober:
    """Times kernels and torch at shapes through the worker's compare request: the kernels
    are compiled once per trial (one binary serves every size)."""

    def __init__(self, spec, builder, worker, by_id: dict, rounds: int, timeout_s: float):
        self.spec, self.builder, self.worker, self.by_id = spec, builder, worker, by_id
        self.rounds, self.timeout_s = rounds, timeout_s
        self._art: dict[int, str] = {}
        self.requests = 0
        self.log = None  # called with a line as each timing request starts and ends (pipe compare's progress)
        self.warm: dict | None = None  # the first request's: what a CPU worker warms before its sandbox
        # the curve's other arms: torch.compile, and the user's (op.triton as "triton", op.arms)
        self.arms = {"compile": True, "arms": spec.op.compare_arms()}
        # op.fallbacks: the arms the table may take instead of torch eager, timed at every point
        # beside it (and verified by the worker on the judge's inputs before they count)
        self.fallbacks = {n: spec.op.compare_arms()[n] for n in spec.op.fallbacks}
        # RUN/compare-parts: every worker request's results as it ends, so that a compare cut short
        # (a call's time limit, a kill) resumes where it stopped (`_reuse`); None: none kept
        self.parts_dir: Path | None = None
        # the run's ledger, where each kept part's sha256 is recorded as it is written: a part whose
        # bytes do not hash to its key's last record (edited, or kept by an older pipe) is timed
        # again, so that a resumed compare never takes figures the judge did not write (None: unchecked)
        self.ledger_path: Path | None = None
        self._digests: dict | None = None
        self.reused: list[dict] = []  # {"date", "machine", "shapes"} of each part taken from it
        self._found: set | None = None  # the part files there when this compare first looked
        self._arm_src: dict[str, str] = {}  # "module:function" -> a digest of its source (_arm_digest)
        self.machine: dict = {}

    def serves(self, tid: int, shape: dict) -> bool:
        t = self.by_id[tid]
        return self.spec.kernel.serves_shape(t.params, shape, self.spec.op.shape_env({})["elem"])

    def artifact(self, tid: int) -> str:
        if tid not in self._art:
            t = self.by_id[tid]
            arts, bad = self.builder.compiled(self.builder.render_all(t.params, t.variant, [self.spec.op.shapes[0]]))
            if bad is not None:
                from .compare import CompareError

                raise CompareError(f"trial #{tid} no longer compiles: {bad.reason}")
            self._art[tid] = arts[0]
        return self._art[tid]

    def verify(self, tid: int, shapes: list[dict]) -> dict:
        """The worker's verification of one kernel at these shapes (no timing): the trial's
        checks in one round a shape (new buffers, two runs with two decoys, every element
        against the reference; the distributions taken in turn from shape to shape), on inputs
        drawn in secret; the trial itself had the rounds at the same addresses. {"status",
        "reason"}."""
        t = self.by_id[tid]
        job = {"seed": secrets.randbits(48), "artifacts": [self.artifact(tid)] * len(shapes),
               "geometry": self.builder.geometry(t.params, shapes), "shapes": shapes, "n_timed": 0,
               "checks": 1}
        approved, why = self.builder.approved_artifacts(t.params, t.variant, [self.spec.op.shapes[0]])
        if why:
            return {"status": "forbidden", "reason": f"unjudged_precision: {why}"}
        if approved is not None:  # a variant's error held to the approved build's (worker evaluate)
            job["approved"] = [approved[0]] * len(shapes)
        self.requests += 1
        return self.worker.request(("evaluate", job), self.timeout_s)

    def time(self, shapes: list[dict], kernels: list[list[int]], others: bool = False,
             mode_of: list | None = None) -> list[dict]:
        """Per shape: {"#tid" | "torch eager" | ...: {median, rounds, error}} for its kernels
        (those that serve it) and torch eager; with `others`, torch.compile, the user's arms
        (op.triton, op.arms) and copy too. `mode_of[i]`: an earlier shape whose launch mode
        (graph replay or direct) shape i's arms take."""
        cands = []
        for shape, tids in zip(shapes, kernels):
            row = []
            for tid in dict.fromkeys(tids):
                if not self.serves(tid, shape):
                    continue
                t = self.by_id[tid]
                geo = self.builder.geometry(t.params, [shape])[0]
                row.append({"label": f"#{tid}", "trial": tid, "artifact": self.artifact(tid), "geometry": geo})
            cands.append(row)
        self.requests += 1
        parts = request_parts(len(shapes), mode_of)
        t0 = time.monotonic()
        if self.log:
            self.log(f"timing request {self.requests}: {len(shapes)} shapes, {sum(map(len, cands))} kernel timings"
                     + (", with every arm" if others else "")
                     + (f", in {len(parts)} parts" if len(parts) > 1 else ""))
        out: list[dict] = []
        kept_shapes = 0  # of this request, taken from an unfinished compare's parts
        for k, (a, b) in enumerate(parts):
            # each part one worker request (the shapes are timed one after another either way:
            # a part only brings a progress line and its own timeout); a twin's `mode_of`
            # always names a shape of its own part
            job = {"seed": secrets.randbits(48), "rounds": self.rounds, "eager": True, "shapes": shapes[a:b],
                   "compile": others and self.arms["compile"],
                   "arms": (self.arms.get("arms") or {}) if others else dict(self.fallbacks),
                   "fallbacks": list(self.fallbacks),
                   "copy": others,
                   "candidates": cands[a:b],
                   **({"mode_of": [None if m is None else m - a for m in mode_of[a:b]]} if mode_of else {})}
            key = self._part_key(job) if self.parts_dir is not None else ""
            kept = self._reuse(key)
            if kept is not None:
                out.extend(kept)
                kept_shapes += b - a
            else:
                if self.warm is not None:
                    job["warm"], self.warm = self.warm, None
                r = self.worker.request(("compare", job), self.timeout_s)
                if r.get("status") != "ok":
                    from .compare import CompareError

                    raise CompareError(f"the comparison failed ({r.get('status')}): {r.get('reason', '')}")
                self.machine = r.get("machine", {})
                self._same_machine()
                self._keep(key, r["shapes"])
                out.extend(r["shapes"])
            if self.log and k + 1 < len(parts):
                took, timed = time.monotonic() - t0, b - kept_shapes
                self.log(f"  {b}/{len(shapes)} shapes in {took:.0f} s"
                         + (f" ({kept_shapes} kept from an unfinished compare)" if kept_shapes else "")
                         + (f", about {_duration(took * (len(shapes) - b) / timed)} to go" if timed else ""))
        if self.log:
            self.log(f"timing request {self.requests} done in {time.monotonic() - t0:.1f} s"
                     + (f" ({kept_shapes} of {len(shapes)} shapes kept from an unfinished compare)"
                        if kept_shapes else ""))
        return out

    def _part_key(self, job: dict) -> str:
        """What a worker request's results depend on: its shapes, rounds, arms and candidates,
        each candidate by its trial, geometry and binary's bytes (not its path), and the spec's
        hash. Not the seed (the rounds' order) nor what it warms."""
        h = hashlib.sha256(self.spec.hash.encode())
        h.update(_runner_digest().encode())  # the judge's protocol: a part of another runner is timed again
        for name, ref in sorted((job.get("arms") or {}).items()):  # the arms' own code (op.triton, op.arms)
            h.update(f"{name}={self._arm_digest(ref)}".encode())
        cands = []
        for row in job["candidates"]:
            cands.append([{**c, "artifact": self.builder.artifact_digest(c["artifact"])} for c in row])
        what = {k: v for k, v in job.items() if k not in ("seed", "warm", "candidates")}
        h.update(json.dumps({**what, "candidates": cands}, sort_keys=True, default=str).encode())
        return h.hexdigest()[:32]

    def _arm_digest(self, ref: str) -> str:
        """A digest of an arm's source ("module:function", as the spec hash takes the
        reference's), worked out once; the name itself where it cannot be read here."""
        if ref not in self._arm_src:
            try:
                from ..core.userpath import reference_source

                text = reference_source(ref, getattr(self.spec, "folder", None))
            except Exception:  # an arm that does not import here is timed (or refused) by the worker
                text = ref
            self._arm_src[ref] = hashlib.sha256(str(text).encode()).hexdigest()
        return self._arm_src[ref]

    def _reuse(self, key: str, timed: bool = True) -> list[dict] | None:
        """A part's results kept by an earlier, unfinished compare of this run, else None (`timed`:
        a timing request's, counted in `reused`; else a verification's verdict)."""
        if self.parts_dir is None:
            return None
        if self._found is None:  # the parts an earlier compare left: never one kept by this compare
            try:
                self._found = {p.stem for p in self.parts_dir.glob("*.json")}
            except OSError:
                self._found = set()
        if key not in self._found:
            return None
        try:
            data = (self.parts_dir / f"{key}.json").read_bytes()
            if self.ledger_path is not None and self._part_digests().get(key) != hashlib.sha256(data).hexdigest():
                if self.log:
                    self.log(f"(part {key} is not the file this run's compare kept: timed again)")
                return None
            doc = json.loads(data)
            shapes = doc["shapes"]
            if not isinstance(shapes, list):
                raise TypeError("shapes")
        except (OSError, ValueError, KeyError, TypeError):
            return None  # unreadable, or a file cut short by a kill: timed again
        if timed:
            self.reused.append({"date": doc.get("date"), "machine": doc.get("machine") or {}, "shapes": len(shapes)})
        elif doc.get("machine") != self.machine:
            return None  # a verdict of another machine: verified again
        if not self.machine:
            self.machine = doc.get("machine") or {}
        self._same_machine()
        return shapes

    def _part_digests(self) -> dict:
        if self._digests is None:
            from ..ledger.ledger import Ledger

            try:
                led = Ledger(self.ledger_path, readonly=True)
                try:
                    self._digests = led.part_digests()
                finally:
                    led.close()
            except sqlite3.DatabaseError:
                self._digests = {}
        return self._digests

    def _same_machine(self) -> None:
        """A table is measured on one machine: every reused part's must be the live worker's
        (or, before any live request, each other's)."""
        for p in self.reused:
            if p["machine"] != self.machine:
                from .compare import CompareError

                raise CompareError(f"{self.parts_dir}: the unfinished compare there was timed on {p['machine']}, "
                                   f"and this one runs on {self.machine}; remove that folder to compare afresh")

    def _keep(self, key: str, shapes: list[dict]) -> None:
        if self.parts_dir is None:
            return
        import datetime as dt

        from ..ledger.ledger import write_atomic

        doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "machine": self.machine, "shapes": shapes}
        text = json.dumps(doc, default=str)
        try:
            self.parts_dir.mkdir(exist_ok=True)
            write_atomic(self.parts_dir / f"{key}.json", text)
            if self.ledger_path is not None:
                self._record_part(key, hashlib.sha256(text.encode()).hexdigest())
        except (OSError, sqlite3.DatabaseError) as e:  # a help to a later compare, never this one's verdict
            if self.log:
                self.log(f"(no part kept for a resume: {e})")
            self.parts_dir = None

    def _record_part(self, key: str, sha: str) -> None:
        from ..ledger.ledger import Ledger

        led = Ledger(self.ledger_path)
        try:
            led.add_part(key, sha)
        finally:
            led.close()


_RUNNER_DIGEST: list = []


def _runner_digest() -> str:
    """A digest of the runner's own code (every .py file under runner/): what a timing means
    (the judge's protocol, its checks) changes with it."""
    if not _RUNNER_DIGEST:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
        _RUNNER_DIGEST.append(h.hexdigest())
    return _RUNNER_DIGEST[0]


PART = 48  # shapes a worker request at most, where a timing request has more (its progress lines)


def request_parts(n: int, mode_of: list | None = None, size: int = PART) -> list[tuple[int, int]]:
    """[start, end) of the worker requests one timing request of n shapes is cut into: about
    `size` shapes each, cut only where no later shape's `mode_of` (the earlier shape whose launch
    mode a twin takes) lies before the cut, so a twin and its shape share a request."""
    if n <= size:
        return [(0, n)]
    # low[i]: the earliest shape that a shape at i or after refers to (n where none)
    low = [n] * (n + 1)
    for i in range(n - 1, -1, -1):
        m = mode_of[i] if mode_of and mode_of[i] is not None else n
        low[i] = min(low[i + 1], m)
    parts, a = [], 0
    for i in range(1, n):
        if i - a >= size and low[i] >= i:
            parts.append((a, i))
            a = i
    parts.append((a, n))
    return parts


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


def fallback_picks(res: dict, fallbacks=(), twins=()) -> dict:
    """{name (None: torch eager): (pick, report)} for every fallback that ran without an error at
    the shape and each of its twins, each its mean over them (best_fallback says why)."""
    out = {}
    for name in ("torch eager", *fallbacks):
        d = res.get(name) or {}
        if d.get("error") or not d.get("rounds"):
            continue
        got = [_split(d["rounds"])]
        bad = False
        for tw in twins:
            e = tw.get(name) or {}
            if e.get("error") or not e.get("rounds"):
                bad = True  # unavailable, or not exact, at a size of the range: never its fallback
                break
            got.append(_split(e["rounds"]))
        if bad:
            continue
        pick = statistics.fmean(g[0] for g in got)
        if pick:
            out[None if name == "torch eager" else name] = (pick, statistics.fmean(g[1] for g in got))
    return out


def best_fallback(res: dict, fallbacks=(), twins=()) -> tuple[str | None, float | None, float | None]:
    """The fastest fallback at one shape: torch eager (None) or an arm of op.fallbacks that ran
    without an error (verified on the judge's inputs), by the even rounds; (name, pick, report).
    With `twins` (the timings of the sizes next to it, `_twins`), each fallback's pick and
    report are its means over the shape and the twins: a fallback fast at the shape alone
    does not take the sizes around it. (The mean, not the median: slow at every other size, a
    fallback costs a random size of the range the mean of its two speeds.) An arm that failed
    at a twin (unavailable, or wrong on the judge's inputs) is no fallback of the range."""
    best = (None, None, None)
    for name, (pick, rep) in fallback_picks(res, fallbacks, twins).items():
        if best[1] is None or pick < best[1]:
            best = (name, pick, rep)
    return best


def _twins(op, axes: list[str], shape: dict, hi: dict, n: int | None = None) -> list[dict]:
    """The n (TWINS) sizes after `shape` along its largest axis, below `hi` there (where the
    range `shape` stands for ends), that lie inside op.domain_where: where the fallback is
    timed again beside `shape`."""
    n = TWINS if n is None else n
    if n <= 0:
        return []
    a = max(axes, key=lambda x: shape[x])
    out = []
    for v in range(shape[a] + 1, min(hi[a], shape[a] + 1 + 4 * n)):
        sh = _inside(op, {**shape, a: v})  # the other sizes (a few-rows level's rows) as they are
        if sh is not None:
            out.append(sh)
            if len(out) == n:
                break
    return out


def time_with_twins(prober: "Prober", shapes: list[dict], kernels: list[list[int]], twins: list[list[dict]]):
    """One timing request (in parts when long): each shape with its kernels, and its twins
    with none (the fallbacks only, in the mode its shape's arms ran: CUDA graph replays or
    direct launches); per shape (its result, its twins' results)."""
    # each shape followed by its twins, so that a long request can be cut between shapes
    # (request_parts) with every twin beside the shape whose mode it takes
    order, ks, mode_of, at = [], [], [], []
    for shape, tids, ts in zip(shapes, kernels, twins):
        at.append(len(order))
        order.append(shape)
        ks.append(tids)
        mode_of.append(None)
        for t in ts:
            order.append(t)
            ks.append([])
            mode_of.append(at[-1])
    res = prober.time(order, ks, mode_of=mode_of if len(order) > len(shapes) else None)
    return [(res[i], res[i + 1:i + 1 + len(ts)]) for i, ts in zip(at, twins)]


def choices_at(res: dict, tids: list[int], fallbacks=(), twins=(), secret: dict | None = None
               ) -> tuple[list[tuple[int, float]], float | None, float | None, str | None]:
    """From one shape's timings: the kernels that beat the fastest fallback (torch eager, or an
    arm of op.fallbacks; over the shape and its `twins`, best_fallback) by more than NOISE,
    fastest first ((tid, reported time)), the fallback's pick and reported times, and its name
    (None: torch eager). With `secret` (the same kernels' timings at a size of the shape's range
    drawn in secret, `_secret_size`), the order is by each kernel's pick there, and a kernel with
    no time there (an error: wrong, or failed) is no choice: the shape is public, one size of
    its range, and a kernel fast at the public sizes alone does not take the range (session 66's
    red team); the shape's own times still say which kernels beat the fallback."""
    fb, e_pick, e_rep = best_fallback(res, fallbacks, twins)
    ranked = sorted(k for k in _kernel_times(res, tids) if e_pick is None or k[0] < e_pick * (1 - NOISE))
    if secret is not None:  # (a kernel that does not serve the secret size comes after, in the shape's order)
        at = {tid: pick for pick, tid, _ in _kernel_times(secret, tids)}
        ranked = (sorted((at[tid], tid, rep) for pick, tid, rep in ranked if tid in at)
                  + [k for k in ranked if f"#{k[1]}" not in secret])
    return [(tid, rep) for _, tid, rep in ranked], e_pick, e_rep, fb


def _kernel_times(res: dict, tids: list[int]) -> list[tuple[float, int, float]]:
    """(pick, tid, reported time) of each kernel of `tids` that ran at a shape without an error."""
    out = []
    for tid in tids:
        d = res.get(f"#{tid}")
        if d and not d.get("error"):
            pick, rep = _split(d.get("rounds") or [])
            if pick:
                out.append((pick, tid, rep))
    return out


def nearest_kernel(res: dict, tids: list[int]) -> dict | None:
    """Where the fallback won a shape: its fastest kernel that ran without an error, as
    {trial, time_s} (the reported time), so a table can say by how much the kernels lost."""
    best = min((k for k in _kernel_times(res, tids) if k[2]), default=None)
    return {"trial": best[1], "time_s": best[2]} if best else None


def candidates(spec, history, top: int) -> list[list[int]]:
    """Per timed shape: the `top` fastest ok trials the run recorded there."""
    out = []
    for i in range(len(spec.op.shapes)):
        ok = [t for t in history if t.status == "ok" and t.times and len(t.times) > i and t.times[i] is not None]
        out.append([t.id for t in sorted(ok, key=lambda t: t.times[i])[:top]])
    return out


def build(spec, history, prober: Prober, top: int = 3, refine: int = REFINE, log=None) -> dict:
    """The range table, measured: see the module's docstring."""
    op = spec.op
    cands = candidates(spec, history, top)
    fbs = list(prober.fallbacks)
    axes = op.axes
    sym, nlv = op.levels
    # a point also stands for the sizes around it (its range): its fallback is timed at its
    # twins too, unless its box is cut into parts measured on their own (several axes,
    # _split_boxes); a named shape's exact entry is its own size's choice
    boxed = len(axes) > 1 and refine > 0 and nlv <= 1
    vals = {a: sorted({sh[a] for sh in op.shapes}) for a in axes}

    def box_hi(sh):  # where the point's own range ends on each axis (its midpoint with the next)
        return {a: next((_geo_mid(sh[a], v) + 1 for v in vals[a] if v > sh[a]), op.domain[a].max + 1) for a in axes}

    def box_lo(sh):  # ... and where it starts (its midpoint with the one before)
        return {a: next((_geo_mid(v, sh[a]) + 1 for v in reversed(vals[a]) if v < sh[a]), op.domain[a].min)
                for a in axes}
    timed = time_with_twins(prober, list(op.shapes), cands,
                            [[] if boxed else _twins(op, axes, sh, box_hi(sh)) for sh in op.shapes])
    secret = _secret_timings(op, timed, cands, prober, box_lo, box_hi, log)
    points = []
    for i, (shape, (r, rt)) in enumerate(zip(op.shapes, timed)):
        ranked, e_pick, e_rep, fb = choices_at(r, cands[i], fbs, rt, (secret.get(i) or {}).get("res"))
        if i in secret:  # (the order by the point alone beside it, for the table's `reordered`)
            secret[i]["use"] = [tid for tid, _ in ranked]
            secret[i]["by_point"] = [tid for tid, _ in choices_at(r, cands[i], fbs, rt)[0]]
        # eager_s: the fallback's time (torch eager's, or the named fallback arm's)
        p = {"shape": shape, "named": i < op.named, "use": [tid for tid, _ in ranked],
             "times_s": {str(tid): t for tid, t in ranked}, "eager_s": e_rep,
             "eager_pick_s": e_pick, "fallback": fb}
        if not ranked and (near := nearest_kernel(r, cands[i])):
            p["nearest"] = near  # the fallback won here: by how much, against the fastest kernel
        if i < op.named:
            x_ranked, _, x_rep, x_fb = choices_at(r, cands[i], fbs)
            p["exact"] = {"shape": shape, "use": [tid for tid, _ in x_ranked],
                          "times_s": {str(tid): t for tid, t in x_ranked}, "eager_s": x_rep, "fallback": x_fb}
        points.append(p)
    for i, p in enumerate(points):
        p["level"] = 0 if i < op.named else (op.level_of(p["shape"]) or 0)
    # the points along the axes: the tuning grid's main level, then a named shape's where the
    # grid has none at its axis values (a named shape the grid also holds is listed once, as named)
    grid, at = [], set()
    for p in [q for q in points[op.named:] if q["level"] == 0] + points[:op.named]:
        key = tuple(p["shape"][a] for a in op.axes)
        if key not in at:
            at.add(key)
            grid.append(p)
    exact = [p.pop("exact") for p in points[:op.named]]
    if len(axes) == 1:
        ranges = _ranges_1d(spec, axes[0], grid, prober, refine, log)
    else:
        ranges = _boxes(spec, axes, grid)
        if boxed:
            ranges = _split_boxes(spec, axes, ranges, prober, log)
    if nlv > 1:
        _level_rows(spec, ranges, [p for p in points[op.named:] if p["level"] > 0], prober, refine, log)
    if len(axes) == 1:
        ranges = _split_unserved(spec, axes[0], ranges, history, prober, top, log)
        ranges = _refine_fallbacks(spec, axes[0], ranges, prober, log)
    lists = [r["use"] for r in ranges + exact] + [w["use"] for r in ranges for w in r.get("rows", ())]
    # where the secret size changed a point's order: the report says so
    moved = [{"point": op.shapes[i], "secret": d["shape"], "by_point": d["by_point"], "use": d["use"]}
             for i, d in sorted(secret.items()) if d["use"] != d["by_point"]]
    return {"axes": axes, **({"reordered": moved} if moved else {}),
            "free": [s for s in op.symbols if s not in axes], "noise": NOISE,
            **({"fallbacks": {n: prober.fallbacks[n] for n in prober.fallbacks}} if prober.fallbacks else {}),
            **({"levels": sym} if nlv > 1 else {}),
            # a `tune` symbol with no max: served up to ROWS_CAP times its tuning value (Op.row_cap)
            **({"row_caps": caps} if (caps := [x for x, d in op.domain.items() if d.tune is not None and d.max is None])
               else {}),
            "ranges": ranges, "exact": exact, "probes": prober.requests,
            # op.batch_invariant: whether the judge found each kernel's rows independent of the batch
            # (the trial's details: True, False, or None where unchecked), for the deterministic mode
            **({"batch_axis": op.batch_axis} if op.batch_axis else {}),
            "kernels": {str(t.id): {"params": t.params, "variant": t.variant,
                                    **({"batch_invariant": t.details.get("batch_invariant")} if op.batch_axis else {})}
                        for t in history if any(str(t.id) in map(str, u) for u in lists)}}


SECRET_TRIES = 8  # draws for a secret size of a point's range that its kernels all serve ...
SECRET_SCAN = 512  # ... each followed by the sizes next to it, both ways, up to this far
ROWS_SPREAD = (0.7, 1.4)  # the rows of a secret size: its point's, times a factor drawn in this span


def _secret_size(op, shape: dict, lo: dict, hi: dict, ok, rng: random.Random) -> dict | None:
    """A size drawn in secret inside [lo, hi) on each range axis (log-uniform), its rows those of
    the shape's own `tune` level (its own where it has none) times a factor drawn in ROWS_SPREAD,
    inside op.domain_where and op.domain, not the shape itself, and one `ok` takes; None after
    SECRET_TRIES draws."""
    level = op.level_of(shape)
    rows = [x for x in op.symbols if x not in op.axes and x in op.domain]
    scale = {}

    def at(env):
        sh = op.point(env, level or 0)
        if level is None:  # a named shape off the grid's levels: its own rows
            sh.update({x: shape[x] for x in op.symbols if x not in op.axes})
        for x in rows:  # the rows off their public value too (a kernel fast there alone: the review)
            d = op.domain[x]
            hi = d.max if d.max is not None else op.row_cap(x, sh)
            sh[x] = max(d.min, min(hi if hi is not None else sh[x], int(round(sh[x] * scale[x]))))
        return sh if sh != shape and op.where_holds(sh) and op.in_domain(sh) is None and ok(sh) else None

    a0 = max(op.axes, key=lambda a: shape[a])
    for _ in range(SECRET_TRIES):
        scale.update({x: math.exp(rng.uniform(math.log(ROWS_SPREAD[0]), math.log(ROWS_SPREAD[1]))) for x in rows})
        env = {}
        for a in op.axes:
            lw, h = lo[a], hi[a] - 1
            v = lw if h <= lw else int(round(math.exp(rng.uniform(math.log(max(lw, 1)), math.log(h)))))
            env[a] = min(max(v, lw), h)
        # the draw, else the nearest size along the largest axis that passes (a kernel may serve
        # one size in 64: a draw alone found one in about half the ranges, session 66's review)
        for d in range(SECRET_SCAN):
            for v in {env[a0] + d, env[a0] - d}:
                if lo[a0] <= v < hi[a0] and (sh := at({**env, a0: v})) is not None:
                    return sh
    return None


def _secret_timings(op, timed: list, cands: list[list[int]], prober: "Prober", box_lo, box_hi, log) -> dict:
    """{point index: {"shape", "res"}}: each point where two or more kernels ran, its
    kernels timed again at a size of its range drawn in secret that they all serve (else one the
    fastest of them at the point serves; one request for all points), which orders them
    (choices_at). Every other size the table's kernels are ranked at is public: the grid, its
    log-midpoints and the typical sizes follow from the spec, so a kernel fast at those alone
    (a fast path at powers of two, or at the grid's own sizes, and a slower one elsewhere) took
    whole ranges from one faster at every other size of them, 1.2 to 1.8 times (session 66's
    red team); the curve and its confirmations time the table only against the fallbacks."""
    rng = random.Random(secrets.randbits(64))
    at = {}
    for i, (shape, (r, _)) in enumerate(zip(op.shapes, timed)):
        ran = [tid for _, tid, _ in _kernel_times(r, cands[i])]
        if len(ran) < 2:
            continue  # one kernel (or none): no order to decide
        sh = _secret_size(op, shape, box_lo(shape), box_hi(shape),
                          lambda s, ran=ran: all(prober.serves(t, s) for t in ran), rng)
        if sh is None:  # none they all serve: one the fastest at the point serves (a kernel that
            # serves few sizes kept its place at the public point so, session 66's review)
            first = min(_kernel_times(r, cands[i]))[1]
            sh = _secret_size(op, shape, box_lo(shape), box_hi(shape), lambda s: prober.serves(first, s), rng)
        if sh is not None:
            at[i] = {"shape": sh, "tids": [t for t in ran if prober.serves(t, sh)]}
    if not at:
        return {}
    if log:
        log(f"the kernels of {len(at)} points at a size of each one's range drawn in secret")
    got = prober.time([d["shape"] for d in at.values()], [d.pop("tids") for d in at.values()])
    for d, res in zip(at.values(), got):
        d["res"] = res
    return at


def drop(table: dict, tid: int, why: str) -> None:
    """Take a kernel out of every list of the table, for a reason the table keeps (`dropped`): a
    shape it would have taken goes to the next kernel of its list that serves it, or to the
    fallback. A level row or range left with no kernel takes the fallback there."""
    for e in table["ranges"] + table["exact"] + [w for r in table["ranges"] for w in r.get("rows", ())]:
        e["use"] = [t for t in e["use"] if int(t) != int(tid)]
        if "times_s" in e:
            e["times_s"] = {k: v for k, v in e["times_s"].items() if int(k) != int(tid)}
    table.setdefault("dropped", {})[str(tid)] = why


VERIFY_BUDGET = 4096  # sizes of the whole table's check, spread over its (kernel, range) pairs
# (not a cap: each pair's sweep adds a quarter of its share, 2 at least, of sizes users call:
# domain.sweep, round_sizes)
VERIFY_MIN = 8  # sizes a pair gets however many pairs share the budget (its box's corners and ends)
VERIFY_CHUNK = 256  # sizes a worker request at most (a compare cut short keeps each request's verdict)


def verify_table(spec, table: dict, prober: Prober, seed: int, per: int | None = None, log=None) -> dict:
    """Every kernel the table lists, verified (not timed) over each range it is listed for, at
    `per` sizes of that range it serves (judge/domain.sweep: all of a short range; else its ends,
    the ends of what the kernel serves, the sizes next to them, powers of two, random sizes);
    by default SWEEP a range, fewer where the table has so many (kernel, range) pairs that
    VERIFY_BUDGET runs out, but at least VERIFY_MIN. Its trial was verified at a few sizes drawn
    from the whole domain; the table ships it for every size of its ranges, so a tail handled
    wrong at one residue, or a size-dependent path, is looked for where it would be used. A
    kernel wrong anywhere is dropped from the whole table (`drop`). Returns {"kernels",
    "shapes", "per", "dropped"} (also the table's `verified`)."""
    from ..judge import domain

    rng = random.Random(seed)
    axes = table["axes"]
    pairs = [(r, tid) for r in table["ranges"]
             for tid in dict.fromkeys(int(t) for u in [r["use"]] + [w["use"] for w in r.get("rows", ())] for t in u)]
    per = per or max(VERIFY_MIN, min(domain.SWEEP, VERIFY_BUDGET // max(1, len(pairs))))
    # per kernel, its ranges in chunks of about VERIFY_CHUNK sizes: (boxes, shapes) a request
    plan: dict[int, list[tuple[list, list]]] = {}
    for r, tid in pairs:
        box = {a: (r["lo"][a], r["hi"][a] - 1) for a in axes}
        chunks = plan.setdefault(tid, [])
        if not chunks or len(chunks[-1][1]) >= VERIFY_CHUNK:
            chunks.append(([], []))
        boxes, got = chunks[-1]
        boxes.append(box)
        for sh in domain.sweep(spec.op, lambda sh, tid=tid: prober.serves(tid, sh), box, rng.getrandbits(48), per):
            if sh not in got:
                got.append(sh)
    total = sum(len(g) for chunks in plan.values() for _, g in chunks)
    if log and plan:
        log(f"verifying the table's {len(plan)} kernels at {total} sizes of their ranges (up to {per} a range)")
    dropped = []
    for tid, chunks in plan.items():
        if not any(shapes for _, shapes in chunks):  # never shipped unverified
            drop(table, tid, "verified over its ranges: unverified, no size of its ranges that it serves could be "
                             "drawn (judge/domain.sweep)")
            dropped.append(tid)
            continue
        for boxes, shapes in chunks:
            if not shapes:
                continue
            # a compare cut short keeps each request's verdict over its ranges (the sizes are
            # drawn afresh in secret each time: the verdict is kept, not the draw)
            key = "verify-" + prober._part_key({"verify": boxes, "per": per, "candidates": [
                [{"trial": tid, "artifact": prober.artifact(tid)}]]}) if prober.parts_dir is not None else ""
            kept = prober._reuse(key, timed=False) if key else None
            if kept:
                r = kept[0]
            else:
                r = prober.verify(tid, shapes)
                if r.get("status") == "error":  # the worker's failure, not the kernel's: no verdict
                    from .compare import CompareError

                    why = f"verifying #{tid} over its ranges failed: {r.get('reason', '')}"[:600]
                    if "OutOfMemoryError" in why:  # the judge worker already tried again with nothing kept
                        why += (f"\n(a table kernel is verified at sizes across what it serves, up to {ROWS_CAP} "
                                "times the tuning rows where op.domain gives the rows no max, against a float64 "
                                "reference: more device memory than is free here. Give the rows a max in "
                                "op.domain, or compare on a GPU with more memory)")
                    raise CompareError(why)
                if key and r.get("status") in ("ok", "wrong"):
                    prober._keep(key, [{k: r.get(k) for k in ("status", "reason")}])
            if r.get("status") != "ok":
                why = f"{r.get('status')}: {r.get('reason', '')}"[:600]
                drop(table, tid, f"verified over its ranges: {why}")
                dropped.append(tid)
                if log:
                    log(f"  #{tid} dropped from the table: {why[:200]}")
                break
    out = {"kernels": len(plan), "shapes": total, "per": per, "dropped": dropped}
    table["verified"] = out
    return out


def drop_wrong_at_curve(table: dict, rows: list[dict]) -> list[int]:
    """A kernel the curve found wrong at a secret point (its check there failed) is dropped from
    the table too; the curve's row keeps the error, so the report says where."""
    out = []
    for row in rows:
        if row.get("table_error") and row["use"].startswith("#"):
            tid = int(row["use"][1:])
            if str(tid) not in table.get("dropped", {}):
                at = "x".join(str(v) for v in row["shape"].values())
                drop(table, tid, f"wrong at the curve's secret point {at}: {row['table_error']}"[:600])
                out.append(tid)
    for row in rows:  # its other points no longer describe the table that ships: marked, not counted
        if row["use"].startswith("#") and int(row["use"][1:]) in out:
            row["dropped"] = True
            row.pop("regret", None)
            row.pop("regret_range", None)
    return out


CONFIRM = 4  # sizes of a range a kernel the curve found slow there is timed at again before a cut


def _round_regrets(table_rounds: list, arm_rounds: list) -> list[float]:
    """The table's time over the arm's minus one, round by round (each pair timed back to back)."""
    return [t / a - 1 for t, a in zip(table_rounds, arm_rounds) if t and a]


def slower_by_median(table_rounds: list, fallback_rounds: list) -> bool:
    """Slower than the fallback by more than NOISE in the median round (two rounds at least): a
    kernel slow in most rounds and fast in one is slow (a clock-keyed one was fast in one round
    of four and never cut, session 38's fourth red team)."""
    pairs = _round_regrets(table_rounds, fallback_rounds)
    return len(pairs) >= 2 and statistics.median(pairs) > NOISE


def confirmer(spec, table: dict, prober: "Prober"):
    """`confirm(tid, holder, row)` for cut_slow_at_curve: the kernel slower than the fallback of
    the list it was taken from (its median round) at most of CONFIRM more secret sizes of that
    range (confirm_points), timed by `prober`."""
    def confirm(tid: int, holder: dict, row: dict) -> bool:
        pts = [p for p in confirm_points(spec, table, holder, row, secrets.randbits(48)) if prober.serves(tid, p)]
        if not pts:
            return False
        alt = holder.get("fallback") or "torch eager"
        res = prober.time(pts, [[tid]] * len(pts), others=alt != "torch eager")
        slow = sum(slower_by_median((r.get(f"#{tid}") or {}).get("rounds") or [], (r.get(alt) or {}).get("rounds") or [])
                   for r in res)
        return 2 * slow > len(pts)
    return confirm


def confirm_points(spec, table: dict, holder: dict, row: dict, seed: int, n: int = CONFIRM) -> list[dict]:
    """n sizes drawn in secret inside the box of the range (or level row) holding a curve point,
    log-uniform on each axis, at the point's own rows where the symbol is not an axis (the
    tuning value there, or the few rows it was drawn with), inside op.domain_where."""
    op = spec.op
    rng = random.Random(seed)
    rng_box = holder if "lo" in holder else next((r for r in table["ranges"] if holder in r.get("rows", ())), None)
    if rng_box is None:
        return []
    out = []
    for _ in range(20 * n):
        if len(out) >= n:
            break
        env = {}
        for a in table["axes"]:
            lo, hi = rng_box["lo"][a], rng_box["hi"][a] - 1
            env[a] = lo if hi <= lo else int(round(math.exp(rng.uniform(math.log(max(lo, 1)), math.log(hi)))))
            env[a] = min(max(env[a], lo), hi)
        shape = op.point(env)
        for x in op.symbols:  # the point's own rows: few where it was drawn with few
            if x not in table["axes"] and row["shape"].get(x) != op.point({a: row["shape"][a] for a in table["axes"]})[x]:
                shape[x] = row["shape"][x]
        if shape != row["shape"] and shape not in out and op.where_holds(shape) and op.in_domain(shape) is None:
            out.append(shape)
    return out


def cut_slow_at_curve(table: dict, rows: list[dict], confirm=None) -> list[tuple[int, str]]:
    """A kernel slower than the table's own fallback at a secret point of the curve, by more
    than NOISE in the median round, and again at most of CONFIRM more sizes drawn in secret inside
    the same range (`confirm(tid, holder, row)`, which times them; None: the point alone), leaves
    the list it was taken from there (the level row's, or the range's own), which then takes
    the fallback. A table times its kernels at the tuning points and cuts a range only between
    points that disagree, so a kernel fast at those sizes and slow between them kept a whole
    range at 2 to 3.5 times torch's time (session 38's third red team); one odd size where
    torch's fast path wins is no such range, hence the confirmation.
    [(trial, range described)] of the cuts; the rows of a cut list keep their figures, marked
    `cut`."""
    out, cut = [], set()  # cut: (id of the entry or level row, trial)
    for row in rows:
        vs = row.get("vs_fallback")
        if not (vs and row["use"].startswith("#") and vs.get("median", vs["range"][0]) > NOISE):
            continue
        tid = int(row["use"][1:])
        e, w = entry_of(table, row["shape"])
        if e is None or "lo" not in e:
            continue  # (a named shape is timed at itself when the table is built)
        # the list the lookup took it from: the level row's, else (a level row's kernels not
        # serving there) the range's own
        holder = w if w is not None and tid in w["use"] else e
        if tid not in holder["use"] or (id(holder), tid) in cut:
            continue
        if confirm is not None and not confirm(tid, holder, row):
            continue
        # the whole list goes: the others were timed at the range's point only, and the first of
        # them that serves the rest of it may never have been (the fallback was, everywhere)
        holder["use"] = []
        cut.add((id(holder), tid))
        at = "x".join(str(v) for v in row["shape"].values())
        why = (f"#{tid} slower than {vs['arm']} at the curve's secret point {at} "
               f"({vs.get('median', vs['range'][0]):+.0%} in the median round, {vs['range'][0]:+.0%} to "
               f"{vs['range'][1]:+.0%})"
               + (f", and at most of {CONFIRM} more sizes of its range" if confirm is not None else ""))
        holder.setdefault("cut", []).append(why)
        table.setdefault("cut", []).append(why)
        span = ", ".join(f"{a} {e['lo'][a]}..{e['hi'][a] - 1}" for a in table["axes"])
        out.append((tid, span))
    for row in rows:  # every point of a list a kernel left: its time is no longer the shipped table's
        if row["use"].startswith("#"):
            e, w = entry_of(table, row["shape"])
            if any((id(h), int(row["use"][1:])) in cut for h in (w, e) if h is not None):
                row["cut"] = True
                row.pop("regret", None)
                row.pop("regret_range", None)
    return out


def _first(use: list[int], prober: Prober, shape: dict) -> int | None:
    return next((tid for tid in use if prober.serves(tid, shape)), None)


def _neighbour_lists(points: list[dict]) -> None:
    """Each point's list: its own choices, then its neighbours' along the sorted order (a
    shape a point's kernels do not serve may be served by a neighbour's). A point whose
    measured choice is the fallback keeps an empty list: its range takes the fallback."""
    for i, p in enumerate(points):
        extra = [t for j in (i - 1, i + 1) if 0 <= j < len(points) for t in points[j]["use"]]
        p["list"] = list(dict.fromkeys(p["use"] + extra)) if p["use"] else []


class Cut(NamedTuple):
    """One boundary to bisect (`_bisect`): values <= lo go to a's list, >= hi to b's."""
    lo: int
    hi: int
    shape_at: Callable  # v -> the shape at v, or None outside op.domain_where
    a_list: list
    b_list: list
    label: str
    twins_at: Callable | None = None  # (shape, hi) -> the sizes where the fallback is timed again


def _bisect(cuts: list[Cut], prober: Prober, refine: int, log) -> list[int]:
    """The cut of each boundary between two neighbouring points' choices on one symbol: the
    first value that goes to b. Where their first choices differ, the two contenders (a kernel
    or the fallback) are timed against each other at a size drawn in secret in the middle half
    of the stretch on a log scale (`_secret_mid`: a log-midpoint follows from the grid, and a
    kernel fast at those sizes alone won the stretch), REFINE times. The
    bisections are independent, so they go in lockstep: each step's midpoints of every
    bisection still going are timed in one request (a request costs a round trip to the worker
    and its set-up; one a step and boundary made most of a small compare's requests). A
    bisection stops where both sides choose the same (the cut does not matter there) or
    MID_TRIES draws lie outside op.domain_where (nothing to time there: the cut stays put)."""
    lo, hi = [c.lo for c in cuts], [c.hi for c in cuts]
    live = range(len(cuts))
    rng = random.Random(secrets.randbits(64))
    for _ in range(refine):
        step = []
        for i in live:
            c = cuts[i]
            if hi[i] - lo[i] <= 1:
                continue
            for _ in range(MID_TRIES):  # (a draw outside op.domain_where is drawn again)
                mid = min(max(_secret_mid(lo[i], hi[i], rng), lo[i] + 1), hi[i] - 1)
                shape = c.shape_at(mid)
                if shape is not None:
                    break
            if shape is None:
                continue
            ka, kb = _first(c.a_list, prober, shape), _first(c.b_list, prober, shape)
            if ka == kb:
                continue
            tw = c.twins_at(shape, hi[i]) if c.twins_at is not None and None in (ka, kb) else []
            step.append((i, mid, shape, ka, kb, tw))
        if not step:
            break
        live = [x[0] for x in step]  # a bisection that stopped stays stopped
        got = time_with_twins(prober, [x[2] for x in step], [[k for k in x[3:5] if k is not None] for x in step],
                              [x[5] for x in step])
        for (i, mid, _, ka, kb, _), (r, rt) in zip(step, got):
            def t_of(k):
                if k is None:  # the fallback: the fastest of torch eager and op.fallbacks' arms
                    return best_fallback(r, list(prober.fallbacks), rt)[1]
                x = r.get(f"#{k}") or {}
                return None if x.get("error") else _split(x.get("rounds") or [])[0]

            ta, tb = t_of(ka), t_of(kb)
            if log:
                def us(t):
                    return f"{t * 1e6:.2f} us" if t is not None else "no time"
                log(f"  {cuts[i].label}={mid}: {'#' + str(ka) if ka else 'torch'} {us(ta)} vs "
                    f"{'#' + str(kb) if kb else 'torch'} {us(tb)}")
            if ta is not None and (tb is None or ta <= tb):
                lo[i] = mid
            else:
                hi[i] = mid
    return [h if h - lw <= 1 else _geo_mid(lw, h) for lw, h in zip(lo, hi)]


def _inside(op, shape: dict) -> dict | None:
    """The shape, or None where op.domain_where does not hold (no size there to time)."""
    return shape if op.where_holds(shape) else None


def _level_rows(spec, ranges: list[dict], level_points: list[dict], prober: Prober, refine: int, log) -> None:
    """Several `tune` levels (few rows, say): each range also gets, for every further level
    tuned at its point's axis values, that level's kernel list and the value of the level
    symbol below which it applies (`rows`, ascending). The cuts between levels are
    measured as the range boundaries are, at the range's point."""
    op = spec.op
    sym = op.levels[0]
    by_level: dict[int, list[dict]] = {}
    for p in level_points:
        by_level.setdefault(p["level"], []).append(p)
    for pts in by_level.values():
        pts.sort(key=lambda p: [p["shape"][a] for a in op.axes])
        _neighbour_lists(pts)
    pending, tops = [], []  # (range, its lower level, the cut to its next level); (range, its top level)
    for r in ranges:
        key = {a: r["point"][a] for a in op.axes}
        levels = [{"shape": r["point"], "list": r["use"], "times_s": r["times_s"], "eager_s": r["eager_s"],
                   "fallback": r.get("fallback")}]
        for pts in by_level.values():
            q = next((p for p in pts if all(p["shape"][a] == v for a, v in key.items())), None)
            if q is not None and q["shape"][sym] != r["point"][sym]:
                levels.append(q)
        levels.sort(key=lambda q: q["shape"][sym])
        label = f"{'x'.join(str(v) for v in key.values())} {sym}"
        r["rows"] = []
        for a, b in zip(levels, levels[1:]):
            pending.append((r, a, Cut(a["shape"][sym], b["shape"][sym],
                                      lambda v, pt=r["point"]: _inside(op, {**pt, sym: v}), a["list"], b["list"], label)))
        tops.append((r, levels[-1]))  # the level of the most rows (the main one, as a rule) serves the rest
    for (r, a, c), cut in zip(pending, _bisect([c for _, _, c in pending], prober, refine, log)):
        r["rows"].append({"below": max(cut, c.lo + 1), "point": a["shape"], "use": a["list"], "times_s": a["times_s"],
                          "eager_s": a["eager_s"], "fallback": a.get("fallback")})
    for r, top in tops:
        r.update({"point": top["shape"], "use": top["list"], "times_s": top["times_s"], "eager_s": top["eager_s"],
                  "fallback": top.get("fallback")})


def _ranges_1d(spec, axis: str, grid: list[dict], prober: Prober, refine: int, log) -> list[dict]:
    d = spec.op.domain[axis]
    grid = sorted(grid, key=lambda p: p["shape"][axis])
    _neighbour_lists(grid)
    tasks = {}  # where the neighbours' first choices differ: the boundary is measured
    for i, (a, b) in enumerate(zip(grid, grid[1:])):
        if a["use"][:1] != b["use"][:1]:
            tasks[i] = Cut(a["shape"][axis], b["shape"][axis], lambda v: _inside(spec.op, spec.op.point({axis: v})),
                           a["list"], b["list"], axis, lambda sh, top: _twins(spec.op, [axis], sh, {axis: top}))
    measured = dict(zip(tasks, _bisect(list(tasks.values()), prober, refine, log)))
    cuts = [max(measured.get(i, _geo_mid(a["shape"][axis], b["shape"][axis])), a["shape"][axis] + 1)
            for i, (a, b) in enumerate(zip(grid, grid[1:]))]
    out = []
    bounds = [d.min] + cuts + [d.max + 1]
    for p, lo, hi in zip(grid, bounds, bounds[1:]):
        out.append({"lo": {axis: lo}, "hi": {axis: hi}, "point": p["shape"], "use": p["list"],
                    "times_s": p["times_s"], "eager_s": p["eager_s"], "fallback": p.get("fallback"),
                    **({"nearest": p["nearest"]} if p.get("nearest") and not p["list"] else {})})
    return out


SPLITS = 4  # new ranges a range may be cut into where its kernels stop serving
# Library fallbacks trade places at finer steps than a grid an octave apart (the coarse MoE
# shape: the expert loop 16 to 19% ahead of torch._grouped_mm at T = 1261 to 1478 and 11% behind
# at 851 and 1703, session 26). Where a range falls back and op.fallbacks names an arm, the
# fallbacks alone are timed at FB_PER_OCTAVE sizes an octave across the range (at most FB_MAX),
# and the range is cut where another fallback is faster by more than NOISE. Where two sizes next
# to each other choose differently, the crossing is found by FB_BISECT bisection steps (session
# 28: torch._grouped_mm ran 742 us at T = 943 and 1172 at 1043, the loop 841 and 884: the
# grouped GEMM's row tiles fill or spill over within 10% of T, so a cut at the log-midpoint of
# sizes 19% apart gave a whole stretch to the wrong one). Eight sizes an octave and four steps
# made the coarse MoE compare run past 340 s where it took 202 (session 28): four and three.
# A cut needs its choice to hold at FB_RUN measured sizes in a row (the bisection's midpoints
# count): under the power cap the stock arms trade places from size to size by a few percent
# with no order that holds at the next size (the coarse MoE shape on the H200, session 30:
# T = 717..762 was cut into three ranges from one size each, the loop at 725, torch._grouped_mm
# at 740 and the loop at 755, and the loop ran 3.5% behind torch.compile at T = 762 in every
# round; T = 675..716 went to torch eager from two sizes, 682 and 710, and the loop ran 5.5%
# ahead of it at T = 691 in every round: two sizes were not enough). A shorter run's sizes take
# the fallback fastest over the run and the size on either side of it together.
FB_PER_OCTAVE = 4
FB_MAX = 32
FB_BISECT = 3
FB_RUN = 3


def _fallback_sizes(lo: int, hi: int) -> list[int]:
    """Log-spaced sizes in [lo, hi), FB_PER_OCTAVE an octave (at most FB_MAX, spread evenly)."""
    n = max(2, int(math.ceil(math.log2(max(hi - 1, lo + 1) / lo) * FB_PER_OCTAVE)) + 1)
    vals = sorted({min(hi - 1, max(lo, int(round(lo * ((hi - 1) / lo) ** (k / (n - 1)))))) for k in range(n)})
    if len(vals) > FB_MAX:
        vals = [vals[round(i * (len(vals) - 1) / (FB_MAX - 1))] for i in range(FB_MAX)]
    return vals


def _runs(names: list) -> list[list[int]]:
    """[first index, last index] of each run of one value in `names`."""
    runs = []
    for i, n in enumerate(names):
        if runs and names[runs[-1][0]] == n:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def _fallback_choice(got: dict, own):
    """The fastest fallback of `got` ({name: (pick, ...)}; None: torch eager), or `own` (the
    range's fallback) where it is within NOISE of that one; `own` where nothing ran."""
    if not got:
        return own
    best = min(got, key=lambda n: got[n][0])
    return own if own in got and got[own][0] <= got[best][0] * (1 + NOISE) else best


def _held_choices(gots: list[dict], own) -> tuple[list, list]:
    """Per measured size of a range that falls back (ascending; each fallback_picks there): the
    fallback each size chose (_fallback_choice), and the one that takes it. A choice takes the
    sizes of its run where the run has FB_RUN sizes or more; a shorter run's sizes take the
    fallback fastest over the run and the size on either side of it together (the sum of its
    picks there, among the fallbacks timed at all of them; the range's own within NOISE of it
    stays). Each short run is judged from the sizes' own choices, never from another run's
    merge; runs of one fallback so held join (the cuts fall between them)."""
    chosen = [_fallback_choice(g, own) for g in gots]
    held = list(chosen)
    for a, b in _runs(chosen):
        if b - a + 1 >= FB_RUN:
            continue
        near = gots[max(a - 1, 0):b + 2]
        common = set.intersection(*(set(g) for g in near))
        held[a:b + 1] = [_fallback_choice({n: (sum(g[n][0] for g in near),) for n in common}, own)] * (b - a + 1)
    return chosen, held


def _refine_fallbacks(spec, axis: str, ranges: list[dict], prober: Prober, log) -> list[dict]:
    """Each range that falls back (no kernel list, no level rows), cut where another of the
    fallbacks (torch eager and op.fallbacks' arms) is measured faster: the fallbacks alone at
    _fallback_sizes across the range, each judged by its mean over the size and its twins; a
    size keeps the range's own fallback unless another beats it by more than NOISE there. Between
    two neighbouring sizes of different choices the fallbacks are timed again at the log-midpoint,
    FB_BISECT times (each step one request for every such pair of the range). A choice must hold
    at FB_RUN sizes in a row to take a stretch; a shorter run's sizes take the fallback fastest
    over them and their two neighbours (_held_choices: the stock arms trade places from size to
    size under the power cap). The cuts lie at the log-midpoints between the closest sizes of
    different choices so held."""
    op = spec.op
    fbs = list(prober.fallbacks)
    out = []
    for r in ranges:
        lo, hi = r["lo"][axis], r["hi"][axis]
        if r["use"] or r.get("rows") or not fbs or hi - lo < 2:
            out.append(r)
            continue
        sizes = [(v, sh) for v in _fallback_sizes(lo, hi) if (sh := _inside(op, op.point({axis: v}))) is not None]
        if len(sizes) < 2:
            out.append(r)
            continue
        own = r.get("fallback")

        def time_at(sizes):  # (size, shape, every fallback's (pick, report) there)
            timed = time_with_twins(prober, [sh for _, sh in sizes], [[] for _ in sizes],
                                    [_twins(op, [axis], sh, {axis: hi}) for _, sh in sizes])
            return [(v, sh, fallback_picks(res, fbs, tw)) for (v, sh), (res, tw) in zip(sizes, timed)]

        picks = time_at(sizes)
        for _ in range(FB_BISECT):  # each change of choice between two sizes: where it happens
            mids = []
            for (va, _, ga), (vb, _, gb) in zip(picks, picks[1:]):
                m = min(max(_geo_mid(va, vb), va + 1), vb - 1)
                if (_fallback_choice(ga, own) != _fallback_choice(gb, own) and va < m < vb
                        and (sh := _inside(op, op.point({axis: m}))) is not None):
                    mids.append((m, sh))
            if not mids:
                break
            picks = sorted(picks + time_at(mids), key=lambda p: p[0])
        chosen, held = _held_choices([g for _, _, g in picks], own)
        if log:
            log(f"  {axis} {lo}..{hi - 1} falls back; at {len(picks)} sizes: "
                + ", ".join(f"{v} {c or 'torch'}" + (f" (held: {h or 'torch'})" if h != c else "")
                            for (v, _, _), c, h in zip(picks, chosen, held)))
        runs = _runs(held)

        def measured(a: int, b: int) -> list:
            """The sizes a part's choice rests on, each fallback's time there (us; `torch` for
            eager): kept in the table, to set beside pipe compare's curve at the same sizes."""
            return [[v, {(k or "torch"): round(g[k][0] * 1e6, 2) for k in g}] for v, _, g in picks[a:b + 1]]

        if len(runs) == 1:
            out.append({**r, "measured": measured(0, len(picks) - 1)})
            continue
        cuts = [lo] + [max(_geo_mid(picks[b][0], picks[b + 1][0]), picks[b][0] + 1) for _, b in runs[:-1]] + [hi]
        for (a, b), c0, c1 in zip(runs, cuts, cuts[1:]):
            _, sh, got = picks[(a + b) // 2]
            n = held[a]
            part = {"lo": {axis: c0}, "hi": {axis: c1}, "point": sh, "use": [], "times_s": {},
                    "eager_s": got[n][1] if n in got else r.get("eager_s"), "fallback": n,
                    "measured": measured(a, b)}
            if r.get("nearest") and c0 <= r["point"][axis] < c1 and n == own:
                # the range's own point, measured against the kernels: how far they were behind
                part.update(point=r["point"], nearest=r["nearest"], eager_s=r.get("eager_s"))
            out.append(part)
    return out


def _levels_of(r: dict) -> list[dict]:
    """A range's lists: the main one (the range itself) and its few-rows levels."""
    return [r, *r.get("rows", ())]


def _nearest_times(spec, history, probe: dict) -> dict[int, float]:
    """Per ok trial: its time a byte at the tuning point nearest to `probe` (log distance over
    every symbol, so a few-rows probe finds its own level) among those it was timed at."""
    op = spec.op

    def dist(sh):
        return sum(abs(math.log(max(sh[a], 1) / max(probe[a], 1))) for a in probe)
    out = {}
    for t in history:
        if t.status != "ok" or not t.times:
            continue
        got = [(dist(op.shapes[i]), i) for i in range(op.named, min(len(t.times), len(op.shapes)))
               if t.times[i] is not None]
        if got:
            i = min(got)[1]
            out[t.id] = t.times[i] / op.bytes(op.shape_env(op.shapes[i]))
    return out


def _split_unserved(spec, axis: str, ranges: list[dict], history, prober: Prober, top: int, log) -> list[dict]:
    """A range whose first kernel (of its main list or a few-rows level's) stops serving inside
    it (a bucket's largest row, say: the point at 2^k chose the bucket of 2^k, and the range runs
    on above it) would hand the rest to whichever kernel of its list serves next, never timed
    there. Such a range is cut where that kernel stops serving; the new range's lists are
    measured at a size drawn in secret in its middle (`_secret_mid`): the old list's kernels and
    the `top` trials nearest in time a
    byte at the closest tuning point, that serve there, against the fallback. The new lists
    keep the old ones' untimed kernels last (they serve elsewhere in the range)."""
    op = spec.op
    rng = random.Random(secrets.randbits(64))

    def shape_at(point: dict, v: int) -> dict | None:
        return _inside(op, {**point, axis: v})

    out = []
    for r in ranges:
        cur = r
        for _ in range(SPLITS):
            lo, hi = cur["lo"][axis], cur["hi"][axis]
            if hi - lo < 2:
                break
            stop = hi
            for lv in _levels_of(cur):
                a = shape_at(lv["point"], lo)
                k = _first(lv["use"], prober, a) if a is not None else None
                if k is None:
                    continue
                b = shape_at(lv["point"], hi - 1)
                if b is None or prober.serves(k, b):
                    continue

                def ok(v, k=k, lv=lv):
                    sh = shape_at(lv["point"], v)
                    return sh is not None and prober.serves(k, sh)
                stop = min(stop, _edge(ok, lo, hi - 1) + 1)
            if stop >= hi:
                break
            mid = _secret_mid(stop, hi - 1, rng)  # (a log-midpoint follows from `serves`: public)
            new = {**cur, "lo": {axis: stop}, "hi": {axis: hi}}
            if "rows" in cur:
                new["rows"] = [dict(w) for w in cur["rows"]]
            for old, lv in zip(_levels_of(cur), _levels_of(new)):
                probe = shape_at(old["point"], mid)
                if probe is None:
                    continue
                near = _nearest_times(spec, history, probe)
                more = sorted((x, tid) for tid, x in near.items() if prober.serves(tid, probe))[:top]
                cands = list(dict.fromkeys([t for t in old["use"] if prober.serves(t, probe)]
                                           + [tid for _, tid in more]))
                res, rt = time_with_twins(prober, [probe], [cands], [_twins(op, [axis], probe, {axis: hi})])[0]
                ranked, _, e_rep, fb = choices_at(res, cands, list(prober.fallbacks), rt)
                use = [tid for tid, _ in ranked]
                if log:
                    log(f"  {axis} {stop}..{hi - 1} at {probe}: {'#' + str(use[0]) if use else 'fallback'} "
                        f"(of {len(cands)} timed)")
                lv.update({"point": probe, "times_s": {str(tid): t for tid, t in ranked}, "eager_s": e_rep,
                           "fallback": fb,
                           "use": use + [t for t in old["use"] if t not in cands] if use else []})
            cur["hi"] = {axis: stop}
            out.append(cur)
            cur = new
        out.append(cur)
    return out


def _boxes(spec, axes: list[str], grid: list[dict]) -> list[dict]:
    vals = {a: sorted({p["shape"][a] for p in grid}) for a in axes}
    out = []
    for p in grid:
        lo, hi = {}, {}
        for a in axes:
            vs, v = vals[a], p["shape"][a]
            i = vs.index(v)
            lo[a] = spec.op.domain[a].min if i == 0 else _geo_mid(vs[i - 1], v) + 1
            hi[a] = spec.op.domain[a].max + 1 if i == len(vs) - 1 else _geo_mid(v, vs[i + 1]) + 1
        out.append({"lo": lo, "hi": hi, "point": p["shape"], "use": p["use"], "times_s": p["times_s"],
                    "eager_s": p["eager_s"], "fallback": p.get("fallback")})
    return out


def _halves(lo: int, hi: int) -> list[tuple[int, int]]:
    """[lo, hi) cut in two at its log-midpoint; whole where it holds one value."""
    if hi - lo < 2:
        return [(lo, hi)]
    c = min(max(_geo_mid(lo, hi - 1), lo + 1), hi - 1)
    return [(lo, c), (c, hi)]


def _touch(a: dict, b: dict, axes: list[str]) -> bool:
    """Whether two boxes share a face, an edge or a corner (or are the same)."""
    return all(b["lo"][x] <= a["hi"][x] and a["lo"][x] <= b["hi"][x] for x in axes)


def _split_boxes(spec, axes: list[str], boxes: list[dict], prober: Prober, log) -> list[dict]:
    """A grid point's box spans an octave of every axis, and what a kernel's launch does at
    a size (its blocks, in whole waves or not) can change across it. So each box is cut in
    two at its log-midpoint on every axis, and each part takes the kernels measured at a size
    drawn in secret in its middle (its centre: a log-centre would be public, session 66's
    review): the box's list and the first choice of every box it touches, timed there
    against the fallback, fastest first; the box's kernels that do not serve the centre come
    after. A part whose centre lies outside op.domain_where keeps the box's list."""
    op = spec.op
    rng = random.Random(secrets.randbits(64))
    parts = []  # (part, its centre and candidates where they are timed, else None)
    for b in boxes:
        # the box's own list, then the first choice of each box it touches
        near = list(dict.fromkeys(b["use"] + [o["use"][0] for o in boxes
                                               if o is not b and o["use"] and _touch(b, o, axes)]))
        cuts = [[]]
        for a in axes:
            cuts = [c + [(a, lo, hi)] for c in cuts for lo, hi in _halves(b["lo"][a], b["hi"][a])]
        for c in cuts:
            part = {**b, "lo": {a: lo for a, lo, _ in c}, "hi": {a: hi for a, _, hi in c}}
            centre = None  # drawn in secret in the part's middle: its log-centre follows from the grid
            for _ in range(MID_TRIES):
                centre = _inside(op, op.point({a: lo if hi - 1 <= lo else _secret_mid(lo, hi - 1, rng)
                                               for a, lo, hi in c}))
                if centre is not None:
                    break
            timed = len(cuts) > 1 and centre is not None and near
            parts.append((part, (centre, near) if timed else None))
    todo = [(p, t) for p, t in parts if t is not None]
    if not todo:
        return [p for p, _ in parts]
    # the fallback also at each centre's twins, inside its part
    res = iter(time_with_twins(prober, [c for _, (c, _) in todo], [k for _, (_, k) in todo],
                               [_twins(op, axes, c, p["hi"]) for p, (c, _) in todo]))
    out = []
    for part, t in parts:
        if t is not None:
            centre, near = t
            r, rt = next(res)
            ranked, _, e_rep, fb = choices_at(r, near, list(prober.fallbacks), rt)
            use = [tid for tid, _ in ranked]
            # the box's kernels that do not serve the centre (not timed there) keep their turn after
            rest = [k for k in part["use"] if k not in use and f"#{k}" not in r]
            # the kernels timed there that did not beat the fallback, for the record (why a part fell back)
            lost = {str(k): _split(r[f"#{k}"]["rounds"])[1] for k in near if k not in use
                    and not (r.get(f"#{k}") or {}).get("error") and (r.get(f"#{k}") or {}).get("rounds")}
            part = {**part, "point": centre, "use": use + rest, "times_s": {str(k): x for k, x in ranked},
                    "eager_s": e_rep, "fallback": fb, **({"lost_s": lost} if lost else {})}
            if log:
                log(f"  box {part['lo']}..{part['hi']} at {centre}: {['#' + str(k) for k in use] or 'torch'}")
        out.append(part)
    return out


def _holds(table: dict, r: dict, shape: dict) -> bool:
    """Whether a range of the table holds the shape (its box on the table's axes, high ends out)."""
    return all(r["lo"][a] <= shape[a] < r["hi"][a] for a in table["axes"])


def entry_of(table: dict, shape: dict) -> tuple[dict | None, dict | None]:
    """The table's entry for a shape, (entry, level row): its exact named shape, else the range
    holding it with the `rows` entry (a `tune` level) whose cut lies above it, if any;
    (None, None) outside every range."""
    for e in table["exact"]:
        if e["shape"] == shape:
            return e, None
    for r in table["ranges"]:
        if _holds(table, r, shape):
            sym = table.get("levels")
            return r, next((w for w in r.get("rows", ()) if shape[sym] < w["below"]), None)
    return None, None


def lookup(table: dict, shape: dict, serves) -> int | None:
    """The table's kernel (a trial id) for a shape, or None for the fallback: an exact named
    shape first, else the range holding it; the first of its kernels that `serves(tid, shape)`."""
    e, _ = entry_of(table, shape)
    if e is None:
        return None
    use = e["use"] if "lo" not in e else level_order(e, table.get("levels"), shape)
    return _first_served(use, serves, shape)


def fallback_of(table: dict, shape: dict) -> str | None:
    """The fallback a shape takes when no kernel of its list serves it: the name of an arm of
    op.fallbacks its range (or named shape, or level row) measured fastest, or None for the
    reference (torch eager)."""
    e, w = entry_of(table, shape)
    return (w or e or {}).get("fallback")


def level_order(r: dict, sym: str | None, shape: dict) -> list:
    """A range's kernels for a shape, in the order the table prefers them: the list of the
    shape's `tune` level (the first `rows` entry whose cut lies above it), then the lists of
    the levels above it, then the main list. A level's kernels may serve fewer sizes than its
    rows reach (kernel.serves): a shape they do not serve takes the next level's kernel that
    serves it before the fallback. A level whose list is empty (the fallback was measured
    fastest there) ends the chain. exported_runtime's _by_range follows the same order."""
    rows = r.get("rows") or ()
    i = next((k for k, w in enumerate(rows) if shape[sym] < w["below"]), len(rows))
    out: list = []
    for use in [w["use"] for w in rows[i:]] + [r["use"]]:
        if not use:  # a level whose measured choice was the fallback: the chain stops there
            break
        out += use
    return list(dict.fromkeys(out))


def _first_served(use, serves, shape):
    return next((int(t) for t in use if serves(int(t), shape)), None)


def secret_points(spec, seed: int, n: int = CURVE_POINTS) -> list[dict]:
    """Points of the domain for the curve, never a tuning point or a named shape: log-uniform
    on the axes (half of them odd), the other symbols at their tuning value (large inputs),
    and a quarter of them with few rows (small inputs, where launch cost counts); each inside
    op.domain_where (a draw outside it is drawn again)."""
    return sorted(_drawn_points(spec, seed, n), key=_point_order(spec.op))


def _point_order(op):
    """The key the curve's points are listed by: the axes, then every symbol."""
    return lambda s: [s[a] for a in op.axes] + [s[x] for x in op.symbols]


def _drawn_points(spec, seed: int, n: int) -> list[dict]:
    """secret_points in the order drawn: the first k of n are secret_points(spec, seed, k)."""
    op = spec.op
    rng = random.Random(seed)
    taken = [dict(s) for s in op.shapes]
    out = []
    for k in range(n * 20):
        if len(out) >= n:
            break
        env = {}
        for a in op.axes:
            d = op.domain[a]
            v = int(round(math.exp(rng.uniform(math.log(d.min), math.log(d.max)))))
            if rng.random() < 0.5:
                v |= 1
            env[a] = min(max(v, d.min), d.max)
        shape = spec.op.point(env)
        if len(out) % 4 == 1:  # rows across all that is served (a kernel slow only there: s38f)
            shape = wide_rows(op, shape, rng)
        if len(out) % 4 == 3:
            for s in op.symbols:
                d = op.domain[s]
                if d.tune is not None:
                    shape[s] = max(d.min, min(shape[s], rng.randint(d.min, d.min + 255)))
        if shape not in taken and op.where_holds(shape):
            taken.append(shape)
            out.append(shape)
    return out


def range_points(spec, table: dict, seed: int, n: int, taken: list[dict]) -> list[dict]:
    """Up to `n` more secret points for the curve: one in each of as many of the table's ranges
    as hold none of `taken`, the ranges drawn in secret, each point log-uniform inside its
    range's box on the axes (never the range's own tuning point, nor a named shape). A table
    claims every range it cuts from measurement; log-uniform points over the whole domain land
    in a short one rarely (a range of 16 tokens at T = 800 of 1 to 8192 takes about 1 draw in
    500), so the curve draws there on purpose."""
    op = spec.op
    rng = random.Random(seed ^ 0x52414E47)  # a stream of its own: the uniform points stay as they were
    axes = table["axes"]
    empty = [r for r in table["ranges"] if not any(_holds(table, r, s) for s in taken)]
    seen = [dict(s) for s in taken] + [dict(s) for s in op.shapes]
    rng.shuffle(empty)
    out: list[dict] = []
    for r in empty:
        if len(out) >= n:
            break
        own = op.point({a: r["point"][a] for a in axes}) if r.get("point") else None
        for _ in range(20):
            env = {}
            for a in axes:
                lo, hi = max(1, r["lo"][a]), max(1, r["hi"][a] - 1)
                v = int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))) if hi > lo else lo
                env[a] = min(max(v, lo), hi)
            shape = op.point(env)
            if shape != own and shape not in seen and _holds(table, r, shape) and op.where_holds(shape):
                seen.append(shape)
                out.append(shape)
                break
    return out


def curve(spec, table: dict, prober: Prober, seed: int, n: int = CURVE_POINTS) -> list[dict]:
    """The table against every arm at secret points (see the module's docstring): two thirds
    drawn over the whole domain, the rest in ranges those left without a point (range_points)."""
    from ..core import figures

    order = _point_order(spec.op)
    drawn = _drawn_points(spec, seed, n)
    uniform = drawn[:n - n // 3]
    extra = range_points(spec, table, seed, n - len(uniform), uniform)
    # fewer ranges without a point than places: the rest over the whole domain, as before
    more = [p for p in sorted(drawn, key=order) if p not in uniform and p not in extra]
    pts = sorted(uniform + extra + more[:max(0, n - len(uniform) - len(extra))], key=order)
    picks = [lookup(table, s, prober.serves) for s in pts]
    res = prober.time(pts, [[p] if p is not None else [] for p in picks], others=True)
    fl = figures.floors(spec, pts)
    rows = []
    for shape, pick, r, f in zip(pts, picks, res, fl):
        arms = {}
        for name in ["torch eager", "torch.compile", *(prober.arms.get("arms") or {}), "copy"]:
            d = r.get(name)
            if d is None:
                continue
            arms[name] = {"time_s": d.get("median"), "error": d.get("error"),
                          **({"clock": d["clock"]} if d.get("clock") else {})}
        fb = fallback_of(table, shape) if pick is None else None
        if pick is not None:
            d = r.get(f"#{pick}") or {}
            table_s, err = d.get("median"), d.get("error")
        elif fb is not None:  # the table's fallback there is an arm of op.fallbacks
            d = r.get(fb) or {}
            table_s, err = d.get("median"), d.get("error")
        else:
            d = r.get("torch eager") or {}
            table_s, err = d.get("median"), None
        table_rounds = d.get("rounds") or []
        table_clock = d.get("clock")  # the SM clock and power over the table's timings (judge/clocks.py)
        best_arm = min(((a["time_s"], name) for name, a in arms.items()
                        if name != "copy" and a["time_s"] and not a["error"]), default=(None, None))
        row = {"shape": shape, "use": f"#{pick}" if pick is not None else ("fallback" + (f": {fb}" if fb else "")),
               "table_s": table_s,
               "table_error": err, "bytes": f["bytes"], "arms": arms, "best_arm": best_arm[1],
               "best_arm_s": best_arm[0],
               # graph replay or direct launches: every arm of a point runs in the same mode
               "mode": (r.get(f"#{pick}") or r.get("torch eager") or {}).get("mode"),
               **({"table_clock": table_clock} if table_clock else {})}
        if pick is not None:  # against what the table would take there without the kernel
            alt = fallback_of(table, shape) or "torch eager"
            alt_rounds = (r.get(alt) or {}).get("rounds") or []
            vs = regret_spread(table_rounds, alt_rounds)
            if vs is not None:
                row["vs_fallback"] = {"arm": alt, "range": vs,
                                      "median": statistics.median(_round_regrets(table_rounds, alt_rounds))}
        if table_s and best_arm[0]:
            row["regret"] = table_s / best_arm[0] - 1
            row["bytes_per_s"] = f["bytes"] / table_s
            spread = regret_spread(table_rounds, (r.get(best_arm[1]) or {}).get("rounds") or [])
            if spread is not None:
                row["regret_range"] = spread
        copy_s = (arms.get("copy") or {}).get("time_s")
        if copy_s and table_s:
            row["copy_fraction"] = copy_s / table_s
        if getattr(spec.op, "traffic", "copy") == "read" and table_s:
            # a read-bound op beats a copy of its bytes: its ceiling is the read-only bandwidth
            row["read_fraction"] = f["t_bw"] / table_s
        rows.append(row)
    return rows


def regret_spread(table_rounds: list, arm_rounds: list) -> list[float] | None:
    """The regret round by round: [lowest, highest] of the table's time over the best arm's
    minus one, each pair from one round (the two ran back to back there, at the same clock and
    temperature, where the rounds' medians may not have). None with fewer than two pairs."""
    pairs = _round_regrets(table_rounds, arm_rounds)
    return [min(pairs), max(pairs)] if len(pairs) >= 2 else None


def beyond_noise(row: dict) -> bool:
    """A regret counts as a loss only where the table was slower than the best arm in every
    round (its spread's low end above zero); a regret whose rounds straddle zero is a tie
    within the noise of the timing (the power cap moves both arms' clocks from one round to
    the next). A point without rounds judges by the regret alone."""
    if (row.get("regret") or 0) <= 0:
        return False
    spread = row.get("regret_range")
    return spread is None or spread[0] > 0


def format_curve(rows: list[dict], axes: list[str]) -> str:
    """The regret table: one line per secret point; op.arms' arms a column each after triton."""
    from .compare import extra_arms

    named = extra_arms(r["arms"] for r in rows)
    wide = {n: max(9, len(n)) for n in named}
    ceiling = "read" if any("read_fraction" in r for r in rows) else "copy"
    head = f"{'shape':>18} {'table':>9} {'TB/s':>6} {ceiling + '%':>6}  {'eager':>9} {'compile':>9} {'triton':>9}  " \
           + "".join(f"{n:>{wide[n]}}  " for n in named) + f"{'regret':>7} {'rounds':>15}  vs"
    lines = [head, "-" * len(head)]

    def us(x, w=9):
        return f"{x * 1e6:{w}.2f}" if x else f"{'-':>{w}}"

    def arm_us(a, n):  # an arm with an error (wrong, or unavailable here) has no time that counts
        d, w = a.get(n) or {}, wide.get(n, 9)
        if d.get("error"):
            return f"{'n/a' if d['error'].startswith('unavailable') else 'wrong':>{w}}"
        return us(d.get("time_s"), w)

    for r in rows:
        a = r["arms"]
        label = "x".join(str(v) for v in r["shape"].values())
        lines.append(f"{label:>18} {us(r['table_s'])} {(r.get('bytes_per_s') or 0) / 1e12:6.2f} "
                     f"{(r.get(ceiling + '_fraction') or 0) * 100:5.0f}%  "
                     f"{us((a.get('torch eager') or {}).get('time_s'))} {us((a.get('torch.compile') or {}).get('time_s'))} "
                     f"{arm_us(a, 'triton')}  "
                     + "".join(f"{arm_us(a, n)}  " for n in named) +
                     f"{(r.get('regret') or 0) * 100:6.1f}% {_spread_text(r):>15}  {r['best_arm'] or '-'}"
                     + f"  [{r['use']}{' dropped' if r.get('dropped') else ''}{' cut' if r.get('cut') else ''}]"
                     + (" graph" if r.get("mode") == "graph" else ""))
    worst = max((r.get("regret") or 0 for r in rows), default=0)
    lost = [r for r in rows if beyond_noise(r)]
    worst_lost = max((r["regret"] for r in lost), default=0)
    lines.append(f"worst regret {worst * 100:.1f}% over {len(rows)} secret points; slower than the best arm in "
                 f"every round at {len(lost)} of them" + (f" (worst {worst_lost * 100:.1f}%)" if lost else "")
                 + " (times in us; \"graph\": "
                 f"every arm of the point timed as CUDA graph replays; regret: over the best arm but copy, "
                 f"[its lowest and highest round by round]"
                 + ("; read%: the table's time against the op's bytes at the profile's read-only bandwidth)"
                    if ceiling == "read" else ")"))
    lines += clock_notes(rows)
    if any(r.get("cut") for r in rows):
        lines.append("[#N cut]: slower than the table's own fallback there and at most of a few more sizes of its "
                     "range: that range's list went to the fallback (cut_slow_at_curve), so its time there is "
                     "counted in no regret")
    if any(r.get("dropped") and not r.get("table_error") for r in rows):
        lines.append("[#N dropped]: a kernel dropped since (wrong at another point): its time there, not the "
                     "shipped table's, counted in no regret")
    for r in rows:  # the table's own choice wrong at a point: it was dropped from the table (drop_wrong_at_curve)
        if r.get("table_error"):
            lines.append(f"the table's {r['use']} at {'x'.join(str(v) for v in r['shape'].values())} (dropped from the "
                         f"table since): {r['table_error']}")
    said: set[str] = set()
    for r in rows:  # why an arm is wrong or n/a: once per arm, at the first point it was
        for n, d in r["arms"].items():
            if d.get("error") and n not in said:
                said.add(n)
                lines.append(f"{n} at {'x'.join(str(v) for v in r['shape'].values())}: {d['error']}")
    return "\n".join(lines)


def _spread_text(r: dict) -> str:
    sp = r.get("regret_range")
    return f"[{sp[0] * 100:.1f}..{sp[1] * 100:.1f}]" if sp else ""


def clock_notes(rows: list[dict]) -> list[str]:
    """A line per secret point whose table or best arm ran below full clock (judge/clocks.py):
    the SM clock and power of both, so that a time is read with the clock it ran at."""
    from ..judge.clocks import notes

    return notes([("x".join(str(v) for v in r["shape"].values()),
                   [("table", r.get("table_clock")),
                    (r.get("best_arm"), (r["arms"].get(r.get("best_arm") or "") or {}).get("clock"))])
                  for r in rows],
                 "below full clock at {n} of " + str(len(rows)) + " points (SM clock median, its low, the power's "
                 "high and NVML's reasons over the timed rounds):")


def format_ranges(table: dict) -> str:
    """The table's ranges, neighbours with the same first choice merged."""
    axes = table["axes"]
    lines = []
    merged: list[dict] = []
    def sig(r):
        return (r["use"][:1], r.get("fallback"), [(w["below"], w["use"][:1], w.get("fallback"))
                                                 for w in r.get("rows", ())])

    def names(use, fb=None):
        return (f"#{use[0]}" + (f" (then {', '.join('#' + str(t) for t in use[1:4])})" if len(use) > 1 else "")
                if use else (f"{fb} (fallback)" if fb else "torch (fallback)"))

    def behind(r):  # a fallback's range: how far its fastest kernel was behind it at the point
        n, e = r.get("nearest"), r.get("eager_s")
        if not (n and e and n.get("time_s")):
            return []
        at = "x".join(str(v) for v in r["point"].values())
        return [f"#{n['trial']} {n['time_s'] / e - 1:+.1%} at {at}"]

    for r in table["ranges"]:
        if merged and len(axes) == 1 and sig(merged[-1]) == sig(r):
            merged[-1]["hi"] = r["hi"]
            merged[-1]["behind"] += behind(r)
        else:
            merged.append({"lo": r["lo"], "hi": r["hi"], "use": r["use"], "rows": r.get("rows", ()),
                           "fallback": r.get("fallback"), "behind": behind(r)})
    sym = table.get("levels")
    for r in merged:
        span = ", ".join(f"{a} {r['lo'][a]}..{r['hi'][a] - 1}" for a in axes)
        if r["rows"]:
            lo = None
            for w in r["rows"]:
                at = f"{lo} <= {sym} < {w['below']}" if lo else f"{sym} < {w['below']}"
                lines.append(f"  {span}, {at}: {names(w['use'], w.get('fallback'))}")
                lo = w["below"]
            lines.append(f"  {span}, {sym} >= {lo}: {names(r['use'], r.get('fallback'))}")
        else:
            lines.append(f"  {span}: {names(r['use'], r.get('fallback'))}"
                         + (f"; the fastest kernel {', '.join(r['behind'])}" if r["behind"] and not r["use"] else ""))
    for x in table.get("row_caps", ()):
        lines.append(f"  every range: {x} up to {ROWS_CAP}x its tuning value (op.domain gives it no max; the judge "
                     "verifies up to there), the fallback above")
    for e in table["exact"]:
        lines.append(f"  exactly {'x'.join(str(v) for v in e['shape'].values())}: "
                     + names(e["use"][:1], e.get("fallback")))
    v = table.get("verified")
    if v:
        lines.append(f"  verified (not timed): {v['kernels']} kernels at {v['shapes']} sizes of the ranges that list "
                     f"them, up to {v['per']} a range; "
                     + (f"{len(v['dropped'])} wrong, dropped" if v["dropped"] else "none wrong"))
    for tid, why in (table.get("dropped") or {}).items():
        lines.append(f"  dropped #{tid}: {why[:300]}")
    for why in table.get("cut", ()):
        lines.append(f"  cut from its range: {why[:300]}")
    if table.get("reordered"):
        def at(sh):
            return "x".join(str(v) for v in sh.values())
        moved = table["reordered"]
        lines.append(f"  ordered at a secret size of its range: {len(moved)} point(s) whose order the point's own "
                     "times would have had otherwise, e.g. " + "; ".join(
                         f"{at(m['point'])}: #{m['by_point'][0] if m['by_point'] else '-'} there, "
                         f"#{m['use'][0] if m['use'] else '-'} at {at(m['secret'])}" for m in moved[:3]))
    if table.get("batch_axis"):
        lines.append(invariance_line(table["batch_axis"], {k: v.get("batch_invariant")
                                                           for k, v in table.get("kernels", {}).items()}))
    return "\n".join(lines)


def invariance_line(axis: str, flags: dict) -> str:
    """The kernels of a table by their batch invariance (op.batch_invariant), in one line."""
    def ids(v):
        return " ".join(f"#{k}" for k, f in sorted(flags.items(), key=lambda kv: int(kv[0])) if f is v) or "none"

    line = f"  batch-invariant ({axis}; the exported op's deterministic mode uses only these): {ids(True)}"
    if any(f is False for f in flags.values()):
        line += f"; not: {ids(False)}"
    if any(f is None for f in flags.values()):
        line += f"; unchecked: {ids(None)}"
    return line
