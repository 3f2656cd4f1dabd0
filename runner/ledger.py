"""The ledger: one SQLite row per trial, committed before the next trial starts.

The table is append-only (triggers refuse UPDATE and DELETE) and each row
carries a hash chained to the previous row's, so an edited or dropped row is
detected by `verify_chain`. Every row records the spec's hash; a run folder
opened with another spec is refused. Resume: a trial is marked in `attempts`
when it starts; on reopen, an attempt without a row was interrupted (the
runner was killed mid-trial) and is tried again, unless it was already
interrupted twice, in which case it is recorded as `crashed` rather than
allowed to take the runner down a third time.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import RunDirError

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    wall_s REAL NOT NULL,
    params TEXT NOT NULL,
    params_key TEXT NOT NULL,
    source_hash TEXT,
    status TEXT NOT NULL,
    reason TEXT NOT NULL,
    times TEXT,
    spreads TEXT,
    metric REAL,
    objective REAL,
    kept INTEGER NOT NULL,
    agent TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    details TEXT NOT NULL,
    variant TEXT,
    chain TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS attempts (params_key TEXT NOT NULL, started_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS variants (
    id TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    agent TEXT NOT NULL,
    created REAL NOT NULL,
    text TEXT NOT NULL,
    diff TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS replies (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    agent TEXT NOT NULL,
    outcome TEXT NOT NULL,
    reply TEXT NOT NULL,
    feedback TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS variants_no_update BEFORE UPDATE ON variants
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS replies_no_update BEFORE UPDATE ON replies
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS replies_no_delete BEFORE DELETE ON replies
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS trials_no_update BEFORE UPDATE ON trials
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS trials_no_delete BEFORE DELETE ON trials
    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
"""

STATUSES = ("ok", "forbidden", "render_error", "compile_error", "pruned", "wrong", "fault",
            "hang", "impossible", "tampered", "error", "crashed")


@dataclass
class Trial:
    params: dict
    status: str
    reason: str = ""
    source_hash: str | None = None
    times: list | None = None  # per-shape median seconds
    spreads: list | None = None  # per-shape interquartile range over median
    metric: float | None = None  # the goal's metric, aggregated over shapes
    objective: float | None = None  # geometric mean of per-shape medians (lower is better)
    kept: bool = False
    agent: str = ""
    details: dict = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0
    wall_s: float = 0.0
    id: int | None = None
    spec_hash: str = ""
    variant: str | None = None  # id of the template variant, None for the spec's template
    chain: str = ""

    @property
    def key(self) -> str:
        return trial_key(self.params, self.variant)


VARIANT_SEP = "#variant:"


def trial_key(params: dict, variant: str | None = None) -> str:
    """What makes two trials the same experiment: the parameters and the template variant."""
    k = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return k + VARIANT_SEP + variant if variant else k


def variant_id(text: str) -> str:
    """A template variant is named by the hash of its text."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def split_key(key: str) -> tuple[dict, str | None]:
    params, _, variant = key.partition(VARIANT_SEP)
    return json.loads(params), (variant or None)


def _row_digest(prev: str, t: Trial) -> str:
    body = {k: v for k, v in asdict(t).items() if k != "chain"}
    return hashlib.sha256((prev + json.dumps(body, sort_keys=True, default=str)).encode()).hexdigest()[:16]


class Ledger:
    def __init__(self, path: Path, readonly: bool = False):
        self.path = path
        if readonly:  # pipe show / pipe runs: look, never write
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30, isolation_level=None)
            return
        self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)

    @classmethod
    def open(cls, run_dir: Path, spec_hash: str, spec_name: str, spec_path: str,
             hash_parts: dict | None = None, template: str | None = None) -> "Ledger":
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"{run_dir}: cannot be a run folder ({e.strerror})") from None
        path = run_dir / "ledger.db"
        try:
            led = cls(path)
            have = led.get_meta("spec_hash")
        except sqlite3.DatabaseError as e:
            raise RunDirError(f"{path}: not a readable ledger ({e})") from None
        if have is None:
            led.set_meta("spec_hash", spec_hash)
            led.set_meta("spec_name", spec_name)
            led.set_meta("spec_path", spec_path)
            led.set_meta("created", str(time.time()))
        elif have != spec_hash:
            raise RunDirError(
                f"{run_dir} holds a run of another spec (hash {have}, this spec is {spec_hash}: "
                f"the spec or its template changed); use a new --run-dir (pipe record --reuse "
                f"{run_dir} takes its verdicts on kernels the change left the same)")
        # what its verdicts depend on, for pipe record --reuse; a run begun before these were kept
        # gets them on its next resume (the same spec hash: the same spec, template, profile, reference)
        if hash_parts and led.get_meta("hash_parts") is None:
            led.set_meta("hash_parts", json.dumps(hash_parts, sort_keys=True))
        if template is not None and led.get_meta("template") is None:
            led.set_meta("template", template)
        return led

    def hash_parts(self) -> dict | None:
        """The digests of what this run's verdicts depend on (spec, template, hardware,
        reference, toolchain, judge), or None for a run that does not record them."""
        raw = self.get_meta("hash_parts")
        try:
            parts = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return None
        return parts if isinstance(parts, dict) else None

    @classmethod
    def read(cls, run_dir: Path) -> "Ledger":
        path = run_dir / "ledger.db"
        if not path.is_file():
            raise RunDirError(f"{run_dir}: no ledger.db here (not a run folder)")
        try:
            led = cls(path, readonly=True)
            led.get_meta("spec_hash")
            return led
        except sqlite3.DatabaseError as e:
            raise RunDirError(f"{path}: not a readable ledger ({e})") from None

    def close(self) -> None:
        self.db.close()

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def begin(self, params_key: str) -> None:
        self.db.execute("INSERT INTO attempts(params_key, started_at) VALUES (?, ?)", (params_key, time.time()))

    def interrupted(self) -> dict[str, int]:
        """params_key -> attempts that never produced a row."""
        done = {r[0] for r in self.db.execute("SELECT params_key FROM trials")}
        out: dict[str, int] = {}
        for (k,) in self.db.execute("SELECT params_key FROM attempts"):
            if k not in done:
                out[k] = out.get(k, 0) + 1
        return out

    def append(self, t: Trial) -> Trial:
        """Commit one row; returns the trial with its id and chain."""
        if t.status not in STATUSES:  # a runner bug, not a trial outcome: fail loudly
            raise ValueError(f"unknown trial status {t.status!r}")
        self.db.execute("BEGIN IMMEDIATE")
        try:
            last = self.db.execute("SELECT id, chain FROM trials ORDER BY id DESC LIMIT 1").fetchone()
            t.id = (last[0] + 1) if last else 1
            t.chain = _row_digest(last[1] if last else "", t)
            self.db.execute(
                "INSERT INTO trials(id, started_at, finished_at, wall_s, params, params_key, source_hash,"
                " status, reason, times, spreads, metric, objective, kept, agent, spec_hash, details, variant, chain)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (t.id, t.started_at, t.finished_at, t.wall_s, json.dumps(t.params, sort_keys=True), t.key,
                 t.source_hash, t.status, t.reason,
                 json.dumps(t.times) if t.times is not None else None,
                 json.dumps(t.spreads) if t.spreads is not None else None,
                 t.metric, t.objective, int(t.kept), t.agent, t.spec_hash,
                 json.dumps(t.details, sort_keys=True, default=str), t.variant, t.chain))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return t

    def trials(self) -> list[Trial]:
        rows = self.db.execute(
            "SELECT id, started_at, finished_at, wall_s, params, source_hash, status, reason, times, spreads,"
            " metric, objective, kept, agent, spec_hash, details, chain, variant FROM trials ORDER BY id").fetchall()
        out = []
        for r in rows:
            out.append(Trial(id=r[0], started_at=r[1], finished_at=r[2], wall_s=r[3], params=json.loads(r[4]),
                             source_hash=r[5], status=r[6], reason=r[7],
                             times=json.loads(r[8]) if r[8] else None,
                             spreads=json.loads(r[9]) if r[9] else None, metric=r[10], objective=r[11],
                             kept=bool(r[12]), agent=r[13], spec_hash=r[14], details=json.loads(r[15]),
                             chain=r[16], variant=r[17]))
        return out

    def add_variant(self, vid: str, parent: str, agent: str, text: str, diff: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO variants(id, parent, agent, created, text, diff) VALUES (?,?,?,?,?,?)",
                        (vid, parent, agent, time.time(), text, diff))

    def variants(self) -> dict[str, dict]:
        rows = self.db.execute("SELECT id, parent, agent, created, text, diff FROM variants ORDER BY created")
        return {r[0]: {"id": r[0], "parent": r[1], "agent": r[2], "created": r[3], "text": r[4], "diff": r[5]}
                for r in rows}

    def add_reply(self, agent: str, outcome: str, reply: str, feedback: str) -> None:
        self.db.execute("INSERT INTO replies(at, agent, outcome, reply, feedback) VALUES (?,?,?,?,?)",
                        (time.time(), agent, outcome, reply[:20000], feedback[:4000]))

    def replies(self) -> list[dict]:
        rows = self.db.execute("SELECT id, at, agent, outcome, reply, feedback FROM replies ORDER BY id")
        return [{"id": r[0], "at": r[1], "agent": r[2], "outcome": r[3], "reply": r[4], "feedback": r[5]}
                for r in rows]

    def verify_chain(self) -> int | None:
        """Id of the first row whose chain does not match, or None if the ledger is intact."""
        prev = ""
        for t in self.trials():
            if _row_digest(prev, t) != t.chain:
                return t.id
            prev = t.chain
        return None


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def tsv(trials: list[Trial], shape_labels: list[str]) -> str:
    head = ["id", "status", "kept", "objective_us", "metric", *[f"t_us[{s}]" for s in shape_labels],
            "params", "variant", "reason"]
    lines = ["\t".join(head)]
    for t in trials:
        times = t.times or [None] * len(shape_labels)
        cells = [str(t.id), t.status, "yes" if t.kept else "",
                 f"{t.objective * 1e6:.3f}" if t.objective else "",
                 f"{t.metric:.4g}" if t.metric is not None else "",
                 *[f"{x * 1e6:.3f}" if x else "" for x in times],
                 json.dumps(t.params, sort_keys=True), t.variant or "",
                 t.reason.replace("\t", " ").replace("\n", " ")]
        lines.append("\t".join(cells))
    return "\n".join(lines) + "\n"
