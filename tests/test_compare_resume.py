"""A range compare cut short resumes from the worker requests it finished (RUN/compare-parts)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from runner.ship import ranges
from runner.ship.compare import CompareError

MACHINE = {"torch": "2.x", "device": "gpu A"}


class Worker:
    """Answers each shape with its size and a fresh count; gives up after `limit` requests."""

    def __init__(self, limit=None, machine=MACHINE):
        self.limit, self.machine, self.jobs = limit, machine, []

    def request(self, msg, timeout):
        if self.limit is not None and len(self.jobs) >= self.limit:
            return {"status": "timeout", "reason": "the call's time ran out"}
        self.jobs.append(msg[1])
        return {"status": "ok", "machine": self.machine,
                "shapes": [{"size": sh["N"], "request": len(self.jobs)} for sh in msg[1]["shapes"]]}


def prober(tmp_path, worker, art_bytes=b"binary 1"):
    art = tmp_path / "k.so"
    art.write_bytes(art_bytes)
    spec = SimpleNamespace(hash="h1", op=SimpleNamespace(compare_arms=lambda: {}, fallbacks=()))
    pr = ranges.Prober(spec, None, worker, {}, rounds=2, timeout_s=10)
    pr.parts_dir = tmp_path / "compare-parts"
    pr._art = {7: str(art)}
    pr.serves = lambda tid, shape: True
    pr.by_id = {7: SimpleNamespace(params={})}
    pr.builder = SimpleNamespace(geometry=lambda params, shapes: [{"grid": 1}],
                                 artifact_digest=lambda path: hashlib.sha256(Path(path).read_bytes()).hexdigest())
    return pr


SHAPES = [{"N": 1000 + i} for i in range(ranges.PART * 3)]


def test_a_compare_cut_short_resumes_from_its_finished_parts(tmp_path):
    first = Worker(limit=2)
    with pytest.raises(CompareError):
        prober(tmp_path, first).time(SHAPES, [[7]] * len(SHAPES))
    assert len(first.jobs) == 2 and len(list((tmp_path / "compare-parts").iterdir())) == 2

    lines = []
    second = Worker()
    pr = prober(tmp_path, second)
    pr.log = lines.append
    out = pr.time(SHAPES, [[7]] * len(SHAPES))
    # only the part not finished is timed again, and every shape gets its own result
    assert len(second.jobs) == 1 and second.jobs[0]["shapes"] == SHAPES[2 * ranges.PART:]
    assert [r["size"] for r in out] == [sh["N"] for sh in SHAPES]
    assert [r["request"] for r in out] == [1] * ranges.PART + [2] * ranges.PART + [1] * ranges.PART
    assert [p["shapes"] for p in pr.reused] == [ranges.PART, ranges.PART]
    assert f"{2 * ranges.PART} of {len(SHAPES)} shapes kept" in lines[-1]


def test_a_kept_part_is_not_reused_for_another_binary_or_on_another_machine(tmp_path):
    prober(tmp_path, Worker()).time(SHAPES, [[7]] * len(SHAPES))
    # the candidate's binary changed: its parts are timed afresh
    w = Worker()
    prober(tmp_path, w, art_bytes=b"binary 2").time(SHAPES, [[7]] * len(SHAPES))
    assert len(w.jobs) == 3
    # another round count, or other shapes: timed afresh
    w = Worker()
    pr = prober(tmp_path, w)
    pr.rounds = 4
    pr.time(SHAPES[:10], [[7]] * 10)
    assert len(w.jobs) == 1
    # the same request on another machine: the kept parts are refused, not mixed in
    pr = prober(tmp_path, Worker(machine={**MACHINE, "device": "gpu B"}))
    with pytest.raises(CompareError, match="another|remove that folder"):
        pr.time(SHAPES + [{"N": 9999}], [[7]] * (len(SHAPES) + 1))


def test_a_part_file_cut_short_by_a_kill_is_timed_again(tmp_path):
    prober(tmp_path, Worker()).time(SHAPES[:10], [[7]] * 10)
    (f,) = (tmp_path / "compare-parts").iterdir()
    f.write_text(f.read_text()[:20])
    w = Worker()
    out = prober(tmp_path, w).time(SHAPES[:10], [[7]] * 10)
    assert len(w.jobs) == 1 and [r["size"] for r in out] == [sh["N"] for sh in SHAPES[:10]]


def test_without_a_parts_folder_nothing_is_kept(tmp_path):
    pr = prober(tmp_path, Worker())
    pr.parts_dir = None
    pr.time(SHAPES[:10], [[7]] * 10)
    assert not (tmp_path / "compare-parts").exists()


def test_parts_kept_by_this_compare_are_not_reused_by_it_and_a_failed_write_is_no_failure(tmp_path):
    w = Worker()
    pr = prober(tmp_path, w)
    pr.time(SHAPES[:10], [[7]] * 10)
    pr.time(SHAPES[:10], [[7]] * 10)  # the same request again in the same compare: timed again
    assert len(w.jobs) == 2 and pr.reused == []
    # a run folder where no part can be written: the compare goes on, with a line saying so
    (tmp_path / "blocked").write_text("a file, not a folder")
    lines, w = [], Worker()
    pr = prober(tmp_path, w)
    pr.parts_dir, pr.log = tmp_path / "blocked" / "compare-parts", lines.append
    out = pr.time(SHAPES[:10], [[7]] * 10)
    assert [r["size"] for r in out] == [sh["N"] for sh in SHAPES[:10]] and pr.parts_dir is None
    assert any("no part kept" in x for x in lines)


def test_a_kept_part_is_not_reused_once_an_arms_code_changed(tmp_path, monkeypatch):
    """The key takes each named arm's source: an arm edited between two calls of one compare is
    timed again rather than mixed with its old figures."""
    mod = tmp_path / "arm_mod_s36.py"
    mod.write_text("def arm(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pr = prober(tmp_path, Worker())
    pr.fallbacks = {"mine": "arm_mod_s36:arm"}
    pr.time(SHAPES[:10], [[7]] * 10)
    w = Worker()
    pr = prober(tmp_path, w)
    pr.fallbacks = {"mine": "arm_mod_s36:arm"}
    pr.time(SHAPES[:10], [[7]] * 10)
    assert w.jobs == []  # the same code: kept
    import sys

    sys.modules.pop("arm_mod_s36", None)
    mod.write_text("def arm(x):\n    return x * 1\n")
    w = Worker()
    pr = prober(tmp_path, w)
    pr.fallbacks = {"mine": "arm_mod_s36:arm"}
    pr.time(SHAPES[:10], [[7]] * 10)
    assert len(w.jobs) == 1  # its source changed: timed again


def test_a_kept_part_edited_or_unrecorded_is_timed_again(tmp_path):
    """Each kept part's sha256 goes to the run's ledger as it is written; a resumed compare takes
    a part only while its bytes hash to its key's last record: an edited figure, or a part file
    put there by anything but this run's compare, is timed again, never taken into the table."""
    import json

    from runner.ledger.ledger import Ledger

    Ledger(tmp_path / "ledger.db").close()

    def run(worker):
        pr = prober(tmp_path, worker)
        pr.ledger_path = tmp_path / "ledger.db"
        return pr, pr.time(SHAPES, [[7]] * len(SHAPES))

    with pytest.raises(CompareError):
        run(Worker(limit=2))
    led = Ledger(tmp_path / "ledger.db")
    assert len(led.part_digests()) == 2
    led.close()
    files = sorted((tmp_path / "compare-parts").iterdir())
    # one part's figures edited: only it (and the unfinished one) is timed again
    doc = json.loads(files[0].read_text())
    doc["shapes"][0]["request"] = 99
    files[0].write_text(json.dumps(doc))
    w = Worker()
    pr, out = run(w)
    assert len(w.jobs) == 2 and [p["shapes"] for p in pr.reused] == [ranges.PART]
    assert 99 not in [r["request"] for r in out]
    assert [r["size"] for r in out] == [sh["N"] for sh in SHAPES]


def test_a_part_file_no_ledger_recorded_is_timed_again(tmp_path):
    """A part whose key the ledger never recorded (an older pipe's, or one copied in) is timed again."""
    from runner.ledger.ledger import Ledger

    prober(tmp_path, Worker()).time(SHAPES[:10], [[7]] * 10)  # kept with no ledger: no record
    Ledger(tmp_path / "ledger.db").close()
    w = Worker()
    pr = prober(tmp_path, w)
    pr.ledger_path = tmp_path / "ledger.db"
    pr.time(SHAPES[:10], [[7]] * 10)
    assert len(w.jobs) == 1 and pr.reused == []
    # recorded by that compare: the next one takes it
    w = Worker()
    pr = prober(tmp_path, w)
    pr.ledger_path = tmp_path / "ledger.db"
    pr.time(SHAPES[:10], [[7]] * 10)
    assert len(w.jobs) == 0 and [p["shapes"] for p in pr.reused] == [10]
