"""The ledger: one SQLite row per trial, committed before the next trial starts.

The table is append-only (triggers refuse UPDATE and DELETE) and each row
carries a hash chained to the previous row's, so an edited row, or one dropped
from the middle, is detected by `verify`. The chain's head (the number of rows
and the last row's digest) is anchored outside the table: in the `head` meta
row, written in the same transaction as each row, and in the run folder's
`run.json` (`ledger_head`, written after each row), so a dropped last row, a
file cut short or a re-chained table shows as a disagreement between them
(`rundir.check_folder` brings in run.json and trials.tsv). Every row records the spec's hash; a run folder
opened with another spec is refused. Resume: a trial is marked in `attempts`
when it starts; on reopen, an attempt without a row was interrupted (the
runner was killed mid-trial) and is tried again, unless it was already
interrupted twice, in which case it is recorded as `crashed` rather than
allowed to take the runner down a third time. `pipe compare` records the sha256 of each
compare.json it writes in `compares` (append-only, chained, its head in the `compare_head`
meta row), and export takes compare.json's verdicts only where its bytes match the last.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.errors import RunDirError
from ..core.records import STATUSES, Trial, variant_id

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
CREATE TABLE IF NOT EXISTS compares (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    sha256 TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    ledger_rows INTEGER NOT NULL,
    ledger_chain TEXT NOT NULL,
    chain TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS compare_parts (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    key TEXT NOT NULL,
    sha256 TEXT NOT NULL
);
"""
# append-only: each table's rows neither changed nor removed (variants: never changed)
SCHEMA += "".join(f"CREATE TRIGGER IF NOT EXISTS {table}_no_{what.lower()} BEFORE {what} ON {table}\n"
                  "    BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;\n"
                  for table, whats in (("trials", ("UPDATE", "DELETE")), ("variants", ("UPDATE",)),
                                       ("replies", ("UPDATE", "DELETE")), ("compares", ("UPDATE", "DELETE")),
                                       ("compare_parts", ("UPDATE", "DELETE")))
                  for what in whats)

@dataclass
class LedgerCheck:
    """What `Ledger.verify` found: intact, or the first row that cannot be trusted and why."""
    intact: bool
    rows: int  # rows the ledger holds (that could be read)
    first_bad_row: int | None = None  # None on an intact ledger (or when no row can be named)
    reason: str = ""
    note: str = ""  # a limit of the check on an intact ledger (a ledger without a head anchor)
    trials: list = field(default_factory=list, repr=False)  # the rows read, for the caller
    resumed_after: int | None = None  # a broken ledger resumed with --force: the rows it had then
    vouched: int = 0  # rows that run.json's head anchor vouches for (when it agrees with the ledger)

    def trusted(self, history: list) -> list:
        """The rows before the first bad one (all of them on an intact ledger), and those that a
        run resumed with --force appended after the damage it was told about."""
        if self.intact:
            return list(history)
        cut = self.first_bad_row if self.first_bad_row is not None else self.vouched + 1
        after = self.resumed_after if self.resumed_after is not None else float("inf")
        return [t for t in history if t.id is not None and (t.id < cut or t.id > after)]

    def as_dict(self) -> dict:
        return {"intact": self.intact, "rows": self.rows, "first_bad_row": self.first_bad_row,
                "reason": self.reason or None, "note": self.note or None, "resumed_after": self.resumed_after}

    def problem(self) -> str:
        where = f"row {self.first_bad_row}" if self.first_bad_row is not None else "its head"
        return f"the ledger is broken at {where}: {self.reason}"


HEAD_NOTE = "no head anchor (a ledger from an older pipe): a deleted last row cannot be detected"


def _row_digest(prev: str, t: Trial) -> str:
    body = {k: v for k, v in asdict(t).items() if k != "chain"}
    return hashlib.sha256((prev + json.dumps(body, sort_keys=True, default=str)).encode()).hexdigest()[:16]


COMPARE_COLS = ("id", "at", "sha256", "spec_hash", "ledger_rows", "ledger_chain", "chain")


def _compare_digest(prev: str, rec: dict) -> str:
    """A compare record's link in its own chain (as _row_digest is a trial row's)."""
    body = {k: rec[k] for k in COMPARE_COLS if k != "chain"}
    return hashlib.sha256((prev + json.dumps(body, sort_keys=True)).encode()).hexdigest()[:16]


def _wal_in_use(path: Path) -> bool:
    """Whether a writer may hold the ledger open (its -wal or -shm file exists): then it is read
    through SQLite's shared memory; otherwise as an immutable file, which creates nothing beside
    it (a checked-in run folder, a read-only mount)."""
    return Path(f"{path}-wal").exists() or Path(f"{path}-shm").exists()


def _refuse_another_specs_folder(run_dir: Path, path: Path, spec_hash: str) -> None:
    """Before a ledger is created or stamped: a folder whose run.json names another spec, its
    ledger missing or empty, is that spec's run, damaged. Stamping a new ledger there would
    change the evidence (the folder would then read as this spec's run): refused, the folder
    left as it was."""
    try:
        empty = not path.exists() or path.stat().st_size == 0
        doc = json.loads((run_dir / "run.json").read_text()) if empty else None
    except (OSError, ValueError):
        return
    theirs = doc.get("spec_hash") if isinstance(doc, dict) else None
    if isinstance(theirs, str) and theirs != spec_hash:
        raise RunDirError(f"{run_dir} holds a run of another spec ({doc.get('spec', '?')}, hash {theirs}, by its "
                          f"run.json; this spec is {spec_hash}), and its ledger is missing or empty: use a new "
                          "--run-dir")


class Ledger:
    def __init__(self, path: Path, readonly: bool = False):
        self.path = path
        if readonly:  # pipe show / pipe runs: look, never write
            from .rundir import lock_held

            # nobody writing (no -wal or -shm beside it, no pipe process holding the folder): read
            # the file as it is, leaving nothing beside it; else through SQLite's shared memory
            still = not _wal_in_use(path) and not lock_held(path.parent)
            self.db = sqlite3.connect(f"file:{path}?mode=ro" + ("&immutable=1" if still else ""), uri=True,
                                      timeout=30, isolation_level=None)
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
            what = "it is a file, not a folder" if run_dir.is_file() else e.strerror
            raise RunDirError(f"{run_dir}: cannot be a run folder ({what})") from None
        path = run_dir / "ledger.db"
        _refuse_another_specs_folder(run_dir, path, spec_hash)
        try:
            led = cls(path)
            have = led.get_meta("spec_hash")
        except sqlite3.DatabaseError as e:
            raise RunDirError(f"{path}: not a readable ledger ({e})" + _damage(run_dir)) from None
        if have is None:
            led.set_meta("anchored", "1")  # this ledger keeps its head (a missing one is then removed)
            # and records every compare.json pipe compare writes: one with no record is not compare's
            led.set_meta("compare_kept", "1")
            led.set_meta("head", json.dumps({"rows": 0, "chain": ""}))
            led.set_meta("spec_hash", spec_hash)
            led.set_meta("spec_name", spec_name)
            led.set_meta("spec_path", spec_path)
            led.set_meta("spec_abspath", str(Path(spec_path).resolve()))  # for commands run from elsewhere
            led.set_meta("created", str(time.time()))
        elif have != spec_hash:
            try:
                empty = not led.trials()
            except Exception:
                empty = False
            raise RunDirError(
                f"{run_dir} holds a run of another spec (hash {have}, this spec is {spec_hash}: "
                f"{_what_changed(led, hash_parts)} changed); "
                + (f"it holds no trial: remove it (rm -r {run_dir}) to start again there, or use a new --run-dir"
                   if empty else "use a new --run-dir" + (
                       f" (pipe record --reuse {run_dir} takes its verdicts on kernels the change left the same)"
                       if _changed(led, hash_parts) == ["template"] else "")))
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

    damaged: str | None = None  # Ledger.read(damaged_ok=True): why the meta table cannot be read
    truncated: str | None = None  # Ledger.read(damaged_ok=True): the file is shorter than its header says
    _tmp: str | None = None  # the zero-padded copy a file cut short is read from

    @classmethod
    def read(cls, run_dir: Path, damaged_ok: bool = False) -> "Ledger":
        """Open a run folder's ledger to read. With `damaged_ok`, a SQLite file whose meta table
        cannot be read (cut short, say) is opened all the same, for `verify` to name the first
        row lost; `damaged` says why."""
        path = run_dir / "ledger.db"
        if not path.is_file():
            raise RunDirError(f"{run_dir}: no ledger.db here (not a run folder)")
        led = None
        cut = _cut_short(path)
        try:
            if cut and damaged_ok:  # read a copy padded to its length: the pages left still read
                import shutil
                import tempfile

                tmp = tempfile.mkdtemp(prefix="pipe-ledger-")
                shutil.copyfile(path, Path(tmp) / "ledger.db")
                with open(Path(tmp) / "ledger.db", "r+b") as f:
                    f.truncate(cut[1])
                led = cls(Path(tmp) / "ledger.db", readonly=True)
                led.path, led._tmp, led.truncated = path, tmp, cut[0]
            elif cut:
                raise sqlite3.DatabaseError(cut[0])
            else:
                led = cls(path, readonly=True)
            led.get_meta("spec_hash")
            return led
        except sqlite3.DatabaseError as e:
            if damaged_ok and led is not None and _is_sqlite(path):
                led.damaged = str(e)
                return led
            if led is not None:
                led.close()
            raise RunDirError(f"{path}: not a readable ledger ({e})" + _damage(run_dir)) from None

    def close(self) -> None:
        self.db.close()
        if self._tmp:
            import shutil

            shutil.rmtree(self._tmp, ignore_errors=True)

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
            self.set_meta("head", json.dumps({"rows": t.id, "chain": t.chain}))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return t

    _COLS = ("SELECT id, started_at, finished_at, wall_s, params, source_hash, status, reason, times, spreads,"
             " metric, objective, kept, agent, spec_hash, details, chain, variant FROM trials")

    @staticmethod
    def _trial(r) -> Trial:
        return Trial(id=r[0], started_at=r[1], finished_at=r[2], wall_s=r[3], params=json.loads(r[4]),
                     source_hash=r[5], status=r[6], reason=r[7],
                     times=json.loads(r[8]) if r[8] else None,
                     spreads=json.loads(r[9]) if r[9] else None, metric=r[10], objective=r[11],
                     kept=bool(r[12]), agent=r[13], spec_hash=r[14], details=json.loads(r[15]),
                     chain=r[16], variant=r[17])

    def trials(self) -> list[Trial]:
        return [self._trial(r) for r in self.db.execute(self._COLS + " ORDER BY id").fetchall()]

    def head(self) -> dict:
        """The chain's head as run.json anchors it: the number of rows and the last row's digest."""
        last = self.db.execute("SELECT id, chain FROM trials ORDER BY id DESC LIMIT 1").fetchone()
        return {"rows": last[0] if last else 0, "chain": last[1] if last else ""}

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

    def add_compare(self, sha256: str, spec_hash: str) -> dict:
        """Record the sha256 of the compare.json pipe compare just wrote, chained to the compare
        records before it and bound to the trial chain's head it was made from; the compare
        chain's head kept in the `compare_head` meta row in the same transaction."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            last = self.db.execute("SELECT id, chain FROM compares ORDER BY id DESC LIMIT 1").fetchone()
            head = self.head()
            rec = {"id": (last[0] + 1) if last else 1, "at": time.time(), "sha256": sha256, "spec_hash": spec_hash,
                   "ledger_rows": head["rows"], "ledger_chain": head["chain"]}
            rec["chain"] = _compare_digest(last[1] if last else "", rec)
            self.db.execute(f"INSERT INTO compares({', '.join(COMPARE_COLS)}) VALUES (?,?,?,?,?,?,?)",
                            tuple(rec[k] for k in COMPARE_COLS))
            self.set_meta("compare_head", json.dumps({"rows": rec["id"], "chain": rec["chain"]}))
            self.set_meta("compare_kept", "1")
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return rec

    def add_part(self, key: str, sha256: str) -> None:
        """Record the sha256 of a part file an unfinished range compare kept (RUN/compare-parts/KEY.json):
        a later compare takes the part only while its bytes hash to the last record of its key."""
        self.db.execute("INSERT INTO compare_parts(at, key, sha256) VALUES (?,?,?)", (time.time(), key, sha256))

    def part_digests(self) -> dict[str, str]:
        """The last recorded sha256 of each kept part's key (none in a ledger from before they were kept)."""
        try:
            rows = self.db.execute("SELECT key, sha256 FROM compare_parts ORDER BY id").fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return {}
            raise
        return dict(rows)

    def compares(self) -> list[dict]:
        """pipe compare's records (oldest first); none in a ledger from before they were kept
        (read-only, the table is not created)."""
        try:
            rows = self.db.execute(f"SELECT {', '.join(COMPARE_COLS)} FROM compares ORDER BY id").fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return []
            raise
        return [dict(zip(COMPARE_COLS, r)) for r in rows]

    def verify_chain(self) -> int | None:
        """Id of the first row that cannot be trusted, or None if the ledger is intact."""
        c = self.verify()
        return None if c.intact else (c.first_bad_row or 0)

    def adopt_head(self) -> None:
        """Give a ledger begun by an older pipe its head record (once its chain has been checked)."""
        if self.get_meta("head") is None:
            self.set_meta("head", json.dumps(self.head()))
            self.set_meta("anchored", "1")

    def record_tampering(self, check: LedgerCheck) -> None:
        """Keep what was found when a broken ledger is resumed anyway (--force): the rows appended
        after it re-anchor the head, which must not make the damage disappear."""
        if self.get_meta("tampered") is None:
            try:
                rows = self.head()["rows"]
            except sqlite3.DatabaseError:
                rows = None
            self.set_meta("tampered", json.dumps({"first_bad_row": check.first_bad_row, "reason": check.reason,
                                                  "found": time.time(), "rows_then": rows}))

    def _read_rows(self, upto: int) -> tuple[list[Trial], tuple[int, str] | None]:
        """The rows, or on a damaged file those that can be read one by one, with the first
        that cannot (its id and the error)."""
        try:
            return self.trials(), None
        except (sqlite3.DatabaseError, ValueError) as e:
            first_err = str(e)
        out: list[Trial] = []
        try:
            top = self.db.execute("SELECT max(id) FROM trials").fetchone()[0] or 0
        except sqlite3.DatabaseError:
            top = 0
        for i in range(1, max(top, upto) + 1):
            try:
                r = self.db.execute(self._COLS + " WHERE id=?", (i,)).fetchone()
                if r is None:
                    if i > top:
                        break
                    continue  # a gap: the id check names it
                out.append(self._trial(r))
            except (sqlite3.DatabaseError, ValueError) as e:
                return out, (i, str(e))
        return out, (len(out) + 1, first_err)

    def verify(self, anchor: dict | None = None, anchor_name: str = "run.json",
               tsv_ids: list[int] | None = None) -> LedgerCheck:
        """Check the chain, the row ids (1, 2, ... with no gap), the head kept in the ledger and,
        when given, the head anchored outside it (`anchor`: {"rows", "chain"}, from run.json)
        and the row ids of trials.tsv. Give the outside anchors read before this call: the
        ledger only grows, so what they saw must be a prefix of what it holds now."""
        found: list[tuple[int | None, str]] = []
        note = ""
        own = not self.db.in_transaction
        if own:
            self.db.execute("BEGIN")  # one snapshot: the rows and the head together
        try:
            try:
                head_raw, anchored, tampered = (self.get_meta(k) for k in ("head", "anchored", "tampered"))
            except sqlite3.DatabaseError as e:  # the rows read one by one below name the first lost
                head_raw = anchored = tampered = None
                found.append((None, f"ledger.db is truncated or damaged: its meta table cannot be read ({e})"))
            try:
                head = json.loads(head_raw) if head_raw else None
                if head is not None and not (isinstance(head, dict) and isinstance(head.get("rows"), int)):
                    raise ValueError(head_raw)
            except ValueError:
                head = None
                found.append((None, f"the ledger's head record is not readable ({head_raw!r})"))
            upto = max((x for x in ((head or {}).get("rows"), (anchor or {}).get("rows"), *(tsv_ids or []))
                        if isinstance(x, int)), default=0)
            rows, unreadable = self._read_rows(upto)
            try:
                texts = {k: v["text"] for k, v in self.variants().items()}
            except sqlite3.DatabaseError:  # a damaged file: the rows above name what was lost
                texts = {}
            try:
                compares, compare_head = self.compares(), self.get_meta("compare_head")
            except sqlite3.DatabaseError:
                compares, compare_head = [], None
        finally:
            if own and self.db.in_transaction:
                try:
                    self.db.execute("COMMIT")
                except sqlite3.DatabaseError:  # a read of a damaged page can spoil the commit too
                    pass
        n = len(rows)
        if self.truncated:
            found.append((None, self.truncated))
        if unreadable is not None:
            i, err = unreadable
            found.append((i, f"row {i} cannot be read: ledger.db is truncated or damaged ({err})"))
        expect, prev = 1, ""
        for t in rows:
            if t.id != expect:
                found.append((expect, f"row {expect} is missing (deleted)" if t.id > expect
                              else f"row {t.id} is out of order"))
                break
            if _row_digest(prev, t) != t.chain:
                found.append((t.id, f"row {t.id} was edited (its digest does not match its content)"))
                break
            prev, expect = t.chain, expect + 1
        # the variants table is not chained: a variant is named by the hash of its text, and the
        # chained rows name it by that id, so a text that does not hash to its id was changed after
        # it was judged (what compare and export would build, and a resumed run judge, under it)
        for vid, text in texts.items():
            if variant_id(text) != vid:
                first = next((t.id for t in rows if t.variant == vid), None)
                found.append((first, f"template variant {vid} was edited (its text does not hash to its id)"))
                break
        chains = {t.id: t.chain for t in rows}
        found += _compare_problems(compares, compare_head, chains)
        last = rows[-1].id if rows else 0
        vouched = 0
        for name, h in (("the ledger's head record", head), (f"{anchor_name}'s head anchor", anchor)):
            if not h:
                continue
            hr, hc = h.get("rows"), h.get("chain")
            if not isinstance(hr, int) or hr < 0:
                found.append((None, f"{name} is not readable ({h!r})"))
            elif last < hr:
                miss = f"row {last + 1} is" if last + 1 == hr else f"rows {last + 1} to {hr} are"
                found.append((last + 1, f"{miss} missing: the ledger has {n} rows, {name} says {hr} "
                               + ("(rows deleted or the file cut short)" if h is head
                                  else f"(rows deleted, the file cut short, or {anchor_name} edited)")))
            elif hr and chains.get(hr) != hc:
                found.append((hr, f"row {hr} does not match {name} (the rows up to it were rewritten"
                                  + (f", or {anchor_name} was edited)" if h is anchor else ")")))
            elif h is anchor:
                vouched = hr
            elif h is head and last > hr:
                found.append((hr + 1, f"row {hr + 1} was added outside pipe (the ledger's head record "
                                      f"says {hr} rows, the ledger has {n})"))
        if head is None and head_raw is None:
            if anchored or (anchor or {}).get("rows"):
                found.append((None, "the ledger's head record was removed"))
            else:
                note = HEAD_NOTE
        if tsv_ids:
            extra = sorted(set(tsv_ids) - set(chains))
            if extra:
                found.append((extra[0], f"row {extra[0]} is in trials.tsv but not in the ledger "
                                        f"(the ledger has {n} rows, trials.tsv {len(tsv_ids)})"))
        live = len(found)  # what this check found; the rest was recorded by a forced resume
        rec = None
        if tampered:
            try:
                rec = json.loads(tampered)
                found.append((rec.get("first_bad_row"), f"{rec.get('reason')} (found at "
                              f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(rec.get('found', 0)))}, "
                              "resumed with --force since)"))
            except (ValueError, AttributeError):
                found.append((None, "the ledger was resumed with --force over damage"))
        if not found:
            return LedgerCheck(True, n, note=note, trials=rows)
        row, why = min(found, key=lambda f: (f[0] is None, f[0] or 0))
        # rows a --force resume appended after the damage count, unless the damage reaches them
        after = rec.get("rows_then") if isinstance(rec, dict) else None
        if not isinstance(after, int) or any(r is None or r > after for r, _ in found[:live]):
            after = None
        return LedgerCheck(False, n, row, why, trials=rows, resumed_after=after,
                           vouched=vouched if row is None else 0)


def _compare_problems(recs: list[dict], head_raw: str | None, chains: dict) -> list[tuple[None, str]]:
    """What is wrong with pipe compare's records: the first edited, missing or re-chained one,
    one that names a trial row the ledger no longer holds as it was, and their head (the
    `compare_head` meta row) against the last. Not trial rows: the trials stay trusted."""
    prev = ""
    for i, r in enumerate(recs, 1):
        if r["id"] != i:
            return [(None, f"compare record {i} is missing (deleted)")]
        if _compare_digest(prev, r) != r["chain"]:
            return [(None, f"compare record {i} was edited (its digest does not match its content)")]
        lr = r["ledger_rows"]
        if lr and chains.get(lr, r["ledger_chain"]) != r["ledger_chain"]:
            return [(None, f"compare record {i} does not match trial row {lr} (the rows up to it were rewritten)")]
        prev = r["chain"]
    try:
        head = json.loads(head_raw) if head_raw else None
    except ValueError:
        head = None
    if head_raw and not (isinstance(head, dict) and isinstance(head.get("rows"), int)):
        return [(None, f"the ledger's compare head record is not readable ({head_raw!r})")]
    if head is None:
        return [(None, "the ledger's compare head record was removed")] if recs else []
    n = len(recs)
    if n < head["rows"]:
        return [(None, f"compare records {n + 1} to {head['rows']} are missing (the ledger's compare head "
                       f"record says {head['rows']}, the ledger has {n})")]
    if n > head["rows"]:
        return [(None, f"compare record {head['rows'] + 1} was added outside pipe (the ledger's compare head "
                       f"record says {head['rows']}, the ledger has {n})")]
    if n and recs[-1]["chain"] != head.get("chain"):
        return [(None, f"compare record {n} does not match the ledger's compare head record (rewritten)")]
    return []


def _cut_short(path: Path) -> tuple[str, int] | None:
    """(why, the length its header says) for a ledger file shorter than its header says, else None.
    (A write-ahead log with frames in it may hold pages the file has yet to get: then None.)"""
    try:
        wal = Path(f"{path}-wal")
        if wal.is_file() and wal.stat().st_size > 0:
            return None
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError:
        return None
    if len(head) < 100 or head[:16] != b"SQLite format 3\x00":
        return None
    ps = int.from_bytes(head[16:18], "big")
    ps = 65536 if ps == 1 else ps
    pages = int.from_bytes(head[28:32], "big")
    full = ps * pages
    if pages and size < full:
        return f"ledger.db is cut short ({size} bytes, its header says {pages} pages, {full} bytes)", full
    return None


def _is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


_PART_NAMES = {"spec": "the spec file", "template": "the template", "hardware": "the hardware profile",
               "reference": "the reference"}


def _changed(led: "Ledger", parts: dict | None) -> list[str] | None:
    """The spec's parts ('spec', 'template', 'hardware', 'reference') that differ from those a run
    folder was made with, or None where the folder does not say."""
    try:
        old = json.loads(led.get_meta("hash_parts") or "null")
    except ValueError:
        old = None
    if isinstance(old, dict) and parts:
        return [k for k in _PART_NAMES if k in parts and old.get(k) != parts[k]] or None
    return None


def _what_changed(led: "Ledger", parts: dict | None) -> str:
    """Which of the spec's parts differ from those a run folder was made with: 'the template',
    'the spec file and the reference', ...; the four of them where the folder does not say. Only a
    changed template leaves verdicts pipe record --reuse can take (judge/reuse.py)."""
    diff = [_PART_NAMES[k] for k in _changed(led, parts) or ()]
    if diff:
        return diff[0] if len(diff) == 1 else ", ".join(diff[:-1]) + " and " + diff[-1]
    return "the spec file, its template, hardware profile or reference"


def _damage(run_dir: Path) -> str:
    """The first row a damaged ledger lost, for the message that refuses it ("" if unknown)."""
    from .rundir import check_folder

    try:
        led = Ledger.read(run_dir, damaged_ok=True)
    except Exception:
        return ""
    try:
        c = check_folder(run_dir, led)
        return "" if c.intact else f"; {c.problem()}"
    except Exception:
        return ""
    finally:
        led.close()


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
