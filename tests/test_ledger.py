"""The ledger: append-only, chained, spec-bound, resumable."""

import sqlite3

import pytest

from runner.core.errors import RunDirError
from runner.ledger.ledger import Ledger, tsv
from runner.core.records import Trial


def trial(i, status="ok", **kw):
    return Trial(params={"A": i, "B": "x"}, status=status, reason="" if status == "ok" else "why",
                 times=[1e-3 * i, 2e-3] if status == "ok" else None, objective=1e-3 * i if status == "ok" else None,
                 spec_hash="h1", agent="test", started_at=100.0 + i, finished_at=101.0 + i, wall_s=1.0, **kw)


def test_append_and_read_back(tmp_path):
    led = Ledger.open(tmp_path, "h1", "s", "s.yaml")
    for i in range(1, 4):
        led.append(trial(i, kept=(i == 2)))
    led.append(trial(4, status="fault"))
    led.close()
    led = Ledger.read(tmp_path)
    ts = led.trials()
    assert [t.id for t in ts] == [1, 2, 3, 4]
    assert [t.kept for t in ts] == [False, True, False, False]
    assert ts[1].times == [2e-3, 2e-3] and ts[3].status == "fault" and ts[3].reason == "why"
    assert ts[0].params == {"A": 1, "B": "x"}
    assert led.verify_chain() is None


def test_append_only(tmp_path):
    led = Ledger.open(tmp_path, "h1", "s", "s.yaml")
    led.append(trial(1))
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        led.db.execute("UPDATE trials SET status='wrong'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        led.db.execute("DELETE FROM trials")


def test_tampering_breaks_the_chain(tmp_path):
    led = Ledger.open(tmp_path, "h1", "s", "s.yaml")
    for i in range(1, 5):
        led.append(trial(i))
    # Someone with the file drops the triggers and edits a figure.
    led.db.execute("DROP TRIGGER trials_no_update")
    led.db.execute("UPDATE trials SET objective=1e-9 WHERE id=3")
    assert led.verify_chain() == 3
    led2 = Ledger.open(tmp_path / "b", "h1", "s", "s.yaml")
    for i in range(1, 5):
        led2.append(trial(i))
    led2.db.execute("DROP TRIGGER trials_no_delete")
    led2.db.execute("DELETE FROM trials WHERE id=2")
    assert led2.verify_chain() == 2  # the missing row is named


def test_other_spec_refused(tmp_path):
    Ledger.open(tmp_path, "h1", "s", "s.yaml").close()
    with pytest.raises(RunDirError, match="another spec"):
        Ledger.open(tmp_path, "h2", "s", "s.yaml")


def test_the_refusal_names_the_part_of_the_spec_that_changed(tmp_path):
    parts = {"spec": "a", "template": "b", "hardware": "c", "reference": "d"}
    Ledger.open(tmp_path, "h1", "s", "s.yaml", hash_parts=parts).close()
    with pytest.raises(RunDirError, match=r"reference changed\); it holds no trial: remove it"):
        Ledger.open(tmp_path, "h2", "s", "s.yaml", hash_parts={**parts, "reference": "e"})
    led = Ledger.open(tmp_path, "h1", "s", "s.yaml", hash_parts=parts)
    led.append(trial(1))  # a trial to keep: then only a new folder
    led.close()
    with pytest.raises(RunDirError, match=r"this spec is h2: the reference changed\); use a new --run-dir$"):
        Ledger.open(tmp_path, "h2", "s", "s.yaml", hash_parts={**parts, "reference": "e"})
    # a template alone changed: its verdicts on the kernels that render the same can be taken
    # (pipe record --reuse); with anything else changed that command refuses, so it is not offered
    with pytest.raises(RunDirError, match=r"the template changed\); use a new --run-dir \(pipe record --reuse"):
        Ledger.open(tmp_path, "h5", "s", "s.yaml", hash_parts={**parts, "template": "y"})
    with pytest.raises(RunDirError, match="the spec file and the template changed"):
        Ledger.open(tmp_path, "h3", "s", "s.yaml", hash_parts={**parts, "spec": "x", "template": "y"})
    with pytest.raises(RunDirError, match="the spec file, its template, hardware profile or reference changed"):
        Ledger.open(tmp_path, "h4", "s", "s.yaml")  # nothing to compare with


def test_not_a_ledger(tmp_path):
    (tmp_path / "ledger.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(RunDirError, match="not a readable ledger"):
        Ledger.open(tmp_path, "h1", "s", "s.yaml")
    with pytest.raises(RunDirError, match="no ledger.db"):
        Ledger.read(tmp_path / "empty")


def test_interrupted_attempts(tmp_path):
    led = Ledger.open(tmp_path, "h1", "s", "s.yaml")
    t1 = trial(1)
    led.begin(t1.key)
    led.append(t1)
    t2 = trial(2)
    led.begin(t2.key)  # the runner dies here
    led.begin(t2.key)  # and again on resume
    assert led.interrupted() == {t2.key: 2}


def test_tsv_has_a_row_per_trial(tmp_path):
    rows = tsv([trial(1), trial(2, status="wrong")], ["8x8", "4x4"]).splitlines()
    assert rows[0].split("\t")[:6] == ["id", "status", "kept", "objective_us", "metric", "t_us[8x8]"]
    assert len(rows) == 3
    assert rows[2].split("\t")[1] == "wrong" and rows[2].endswith("why")


def test_compare_records_are_chained_and_checked_with_the_ledger(tmp_path):
    """pipe compare's records of the compare.json files it wrote (their sha256): append-only,
    chained, their head kept in the meta table; an edited, deleted or added record, or a
    removed head, breaks the ledger's check (which refuses compare, export and report) while
    the trial rows stay trusted. A ledger from before the records holds none and stays intact."""
    import json

    led = Ledger.open(tmp_path, "h1", "s", "s.yaml")
    assert led.get_meta("compare_kept") == "1" and led.compares() == []
    for i in range(1, 4):
        led.append(trial(i))
    a = led.add_compare("a" * 64, "h1")
    b = led.add_compare("b" * 64, "h1")
    assert [r["id"] for r in led.compares()] == [1, 2] and a["ledger_rows"] == 3 and b["sha256"] == "b" * 64
    assert led.verify().intact
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        led.db.execute("UPDATE compares SET sha256='c'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        led.db.execute("DELETE FROM compares")
    led.db.execute("DROP TRIGGER compares_no_update")
    led.db.execute("DROP TRIGGER compares_no_delete")
    head = led.get_meta("compare_head")

    def broken(why):
        c = led.verify(led.head())  # run.json's anchor vouches for the trial rows
        assert not c.intact and why in c.reason, c.reason
        assert c.trusted(c.trials) == c.trials and len(c.trials) == 3  # the trials are not what is wrong

    led.db.execute("UPDATE compares SET sha256=? WHERE id=2", ("c" * 64,))
    broken("compare record 2 was edited")
    led.db.execute("UPDATE compares SET sha256=? WHERE id=2", ("b" * 64,))
    assert led.verify().intact
    led.db.execute("DELETE FROM compares WHERE id=2")
    broken("compare records 2 to 2 are missing")
    led.db.execute("DELETE FROM meta WHERE key='compare_head'")
    broken("compare head record was removed")
    led.set_meta("compare_head", json.dumps({"rows": 1, "chain": a["chain"]}))  # the head re-pointed: consistent
    assert led.verify().intact
    led.set_meta("compare_head", head)
    led.db.execute("INSERT INTO compares VALUES (2, 0, ?, 'h1', 3, ?, ?)", ("d" * 64, b["ledger_chain"], b["chain"]))
    broken("compare record 2 was edited")
    led.close()
    # a ledger of an older pipe (tests/data): no compares table (read-only, it is not created), nothing to check
    from .conftest import H200_RUNS

    led = Ledger.read(H200_RUNS["rmsnorm"])
    try:
        assert led.compares() == [] and led.get_meta("compare_kept") is None and led.verify().intact
    finally:
        led.close()
