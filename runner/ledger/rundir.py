"""A run folder as the commands see it: the lock that lets one process at a time
use it, the check of its ledger against the anchors kept outside it (run.json's
`ledger_head`, trials.tsv) and its summary for `pipe show` and `pipe runs`
(ship.rundata opens a finished run for compare, export and report).

Light on purpose (no torch, no judge): `pipe run` checks that its folder is free
before it loads the spec."""

from __future__ import annotations

import json
from pathlib import Path

from ..core.errors import LedgerBroken, PipeError, RunDirError

BUSY = "{} is in use by another pipe process (run or eval); wait for it to finish"


def take_lock(run_dir: Path):
    """Hold the run folder's lock (flock on `.lock`) for this process; refuse a folder another
    process holds. A few quick tries: `pipe show` and `pipe runs` look at the lock for a moment."""
    import fcntl
    import time

    f = open(run_dir / ".lock", "a")
    for i in range(10):
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except OSError:
            if i == 9:
                f.close()
                raise RunDirError(BUSY.format(run_dir)) from None
            time.sleep(0.02)


def lock_held(run_dir: Path) -> bool:
    """Whether a pipe process holds the run folder now (a shared lock is refused while it does)."""
    import fcntl

    try:
        f = open(run_dir / ".lock", "r")
    except OSError:
        return False
    try:
        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(f, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        f.close()


def _run_json(run_dir: Path) -> dict | None:
    try:
        doc = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _tsv_ids(run_dir: Path) -> list[int] | None:
    try:
        lines = (run_dir / "trials.tsv").read_text(encoding="utf-8").splitlines()[1:]
    except (OSError, UnicodeDecodeError):
        return None
    ids = []
    for ln in lines:
        cell = ln.split("\t", 1)[0]
        if cell.isdigit():
            ids.append(int(cell))
    return ids


def check_folder(run_dir: Path, led, doc: dict | None = None):
    """The ledger checked against the head that run.json anchors and the rows trials.tsv lists
    (read before the ledger's rows: the ledger only grows). A ledger that keeps its head with
    rows in it and no anchor in run.json is broken too: run.json anchors it from a run's start."""
    doc = _run_json(run_dir) if doc is None else doc
    ids = _tsv_ids(run_dir)
    anchor = (doc or {}).get("ledger_head")
    anchor = anchor if isinstance(anchor, dict) else None
    check = led.verify(anchor, "run.json", ids)
    if check.intact and not check.note and check.rows and anchor is None:
        check.intact = False
        check.reason = ("run.json is missing or unreadable" if doc is None else "run.json has no head anchor") + \
            f" (the ledger has {check.rows} rows; run.json anchors its head from a run's start)"
    return check


def guard(run_dir: Path, led, force: bool, doing: str):
    """check_folder, and refuse a broken ledger unless --force: then go on with a warning."""
    check = check_folder(run_dir, led)
    if not check.intact:
        msg = f"{run_dir}: {check.problem()}"
        if not force:
            raise LedgerBroken(f"{msg}; refusing to {doing} (pass --force to {doing} anyway)")
        from ..core import log

        if getattr(led, "damaged", None):
            raise RunDirError(f"{msg}; its meta table cannot be read, so even --force cannot go on from it")
        log.get().warning("ledger.broken", run=str(run_dir), first_bad_row=check.first_bad_row,
                          reason=check.reason, forced=True)
    return check


def read_summary(run_dir: Path) -> dict:
    """pipe show's and pipe runs' view of a run folder: run.json's status (`interrupted` when it
    says running and no process holds the folder), the summary of the ledger's trusted rows
    and the ledger's check (`ledger`)."""
    from .ledger import Ledger
    from .summary import summarize

    doc = _run_json(run_dir)
    led = Ledger.read(run_dir, damaged_ok=True)
    try:
        check = check_folder(run_dir, led, doc)
        last = doc or {}
        # no run.json yet: the run stopped before its first summary (during its baseline, say)
        status = last.get("status", "running" if doc is None else "unknown")
        if status == "running" and not lock_held(run_dir):
            status = "interrupted"
        # a ledger whose meta table is lost still names its spec through run.json
        meta = ({"spec_name": last.get("spec"), "spec_path": last.get("spec_path"), "spec_hash": last.get("spec_hash")}
                if led.damaged else {k: led.get_meta(k) for k in ("spec_name", "spec_path", "spec_hash")})
        out = summarize(meta["spec_name"], meta["spec_path"], meta["spec_hash"],
                        led, check.trials, status, last.get("stop"), last.get("goal"),
                        last.get("table_metric") if check.intact else None, check=check)
        if "limit_measured" in last:  # (a run written before it was kept: unsaid)
            out["limit_measured"] = bool(last["limit_measured"])
        return out
    except PipeError:
        raise
    except Exception as e:  # a damaged ledger is bad input here, not a crash
        raise RunDirError(f"{run_dir}: cannot read the ledger: {e}") from None
    finally:
        led.close()
