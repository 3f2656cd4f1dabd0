"""pipe record --reuse: after a template change, a sweep takes an earlier sweep's verdicts for
the configurations whose rendered source and launch the change left the same, judges the
others, and refuses a run made with another spec, hardware profile or reference. On the CPU
backend, through the CLI's entry in the test's process (conftest.pipe_main); each sweep's judge
is a worker process of its own, as in `pipe record`."""

import json
import sqlite3

import pytest
import yaml

from .conftest import FEW_ROWS, PIPELINES, ROOT, pipe_main

pytestmark = pytest.mark.slow

ONLY = ["--only", "THREADS=1", "--only", "ACC=1,2"]  # 6 configurations: ACC x UNROLL
MARK = "#pragma GCC unroll {{ UNROLL }}"


def _project(project, rep_ms=50):
    d = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())
    d["kernel"]["template"] = "tpl/rmsnorm.cpp.j2"
    d["runtime"]["rep_ms"] = rep_ms
    d["op"]["shapes"] = FEW_ROWS  # N = 4096 and 1024 still: a template change below branches on N
    spec = project / "pipelines" / "rmsnorm-cpu.yaml"
    spec.write_text(yaml.safe_dump(d, sort_keys=False))
    (project / "tpl").mkdir(exist_ok=True)
    tpl = project / "tpl" / "rmsnorm.cpp.j2"
    text = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()
    assert text.count(MARK) == 1
    tpl.write_text(text)
    return spec, tpl, text


def _trials(run_dir) -> list[dict]:
    db = sqlite3.connect(f"file:{run_dir}/ledger.db?mode=ro", uri=True)
    try:
        cur = db.execute("SELECT id, params, status, times, details FROM trials ORDER BY id")
        return [{"id": i, "params": json.loads(p), "status": s, "times": json.loads(t) if t else None,
                 "details": json.loads(d)} for i, p, s, t, d in cur]
    finally:
        db.close()


def test_a_changed_template_judges_only_the_kernels_it_changed(project, tmp_path):
    spec, tpl, text = _project(project)
    a, b = tmp_path / "a", tmp_path / "b"
    r = pipe_main("record", str(spec), "--run-dir", str(a), "--out", str(tmp_path / "a.json"), *ONLY, cwd=project)
    assert r.returncode == 0, r.stderr
    first = {json.dumps(t["params"], sort_keys=True): t for t in _trials(a)}
    assert len(first) == 6 and all(t["status"] == "ok" for t in first.values())

    # the change reaches the UNROLL = 4 kernels only (a comment in their source)
    tpl.write_text(text.replace(MARK, "{% if UNROLL == 4 %}// unrolled four times\n{% endif %}" + MARK))
    r = pipe_main("record", str(spec), "--run-dir", str(b), "--out", str(tmp_path / "b.json"), *ONLY,
                  "--reuse", str(a), cwd=project)
    assert r.returncode == 0, r.stderr
    assert "4 verdicts reused from an earlier run" in r.stdout
    second = _trials(b)
    assert len(second) == 6
    for t in second:
        old = first[json.dumps(t["params"], sort_keys=True)]
        if t["params"]["UNROLL"] == 4:  # changed: judged here, with a seed of its own
            assert "reused_from" not in t["details"] and "seed" in t["details"]
        else:  # unchanged: the earlier verdict and times, and where they came from
            assert t["details"]["reused_from"]["trial"] == old["id"]
            assert t["details"]["reused_from"]["run"] == str(a)
            assert t["times"] == old["times"] and "seed" not in t["details"]
    ds = json.loads((tmp_path / "b.json").read_text())
    assert sum("reused_from" in t for t in ds["trials"]) == 4  # the dataset says which are carried over

    # a third sweep reusing the second names the run that judged each kernel first
    c = tmp_path / "c"
    r = pipe_main("record", str(spec), "--run-dir", str(c), "--out", str(tmp_path / "c.json"), *ONLY,
                  "--reuse", str(b), cwd=project)
    assert r.returncode == 0, r.stderr
    origins = {t["details"]["reused_from"]["run"] for t in _trials(c)}
    assert origins == {str(a), str(b)}


def test_a_run_of_another_spec_is_refused(project, tmp_path):
    spec, _, _ = _project(project)
    a = tmp_path / "a"
    r = pipe_main("record", str(spec), "--run-dir", str(a), "--out", str(tmp_path / "a.json"),
                  "--only", "THREADS=1", "--only", "ACC=1", "--only", "UNROLL=1", cwd=project)
    assert r.returncode == 0, r.stderr
    spec, _, _ = _project(project, rep_ms=40)  # the timing protocol changed: no verdict carries over
    r = pipe_main("record", str(spec), "--run-dir", str(tmp_path / "b"), "--out", str(tmp_path / "b.json"),
                  "--only", "THREADS=1", "--only", "ACC=1", "--only", "UNROLL=1", "--reuse", str(a), cwd=project)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{a}: made with another spec than this run" in r.stderr
    assert not (tmp_path / "b").exists()  # refused before the sweep's folder was made
    r = pipe_main("record", str(spec), "--run-dir", str(a), "--reuse", str(a), cwd=project)
    assert r.returncode == 2 and "is the sweep's own run folder" in r.stderr
    r = pipe_main("record", str(spec), "--run-dir", str(tmp_path / "c"), "--reuse", str(tmp_path), cwd=project)
    assert r.returncode == 2 and "no ledger.db here" in r.stderr and "Traceback" not in r.stderr


def test_shapes_that_swap_their_code_are_judged_again(project, tmp_path):
    """The same distinct sources, given to other shapes: the shapes with N >= 4096 took one
    branch and the others another; after the change N >= 1024 take it. The set of sources is
    the same, the source of each shape is not: nothing is reused."""
    spec, tpl, text = _project(project)
    branch = "{% if N >= THRESH %}// a long row\n{% endif %}"
    tpl.write_text(text.replace(MARK, branch.replace("THRESH", "4096") + MARK))
    a, b = tmp_path / "a", tmp_path / "b"
    only = ["--only", "THREADS=1", "--only", "ACC=1", "--only", "UNROLL=1,2"]
    r = pipe_main("record", str(spec), "--run-dir", str(a), "--out", str(tmp_path / "a.json"), *only, cwd=project)
    assert r.returncode == 0, r.stderr
    tpl.write_text(text.replace(MARK, branch.replace("THRESH", "1024") + MARK))
    r = pipe_main("record", str(spec), "--run-dir", str(b), "--out", str(tmp_path / "b.json"), *only,
                  "--reuse", str(a), cwd=project)
    assert r.returncode == 0, r.stderr
    assert "2 verdicts of" in r.stdout and "verdicts reused" not in r.stdout  # offered, none taken
    assert [("reused_from" in t["details"], "seed" in t["details"]) for t in _trials(b)] == [(False, True)] * 2


def _rechain(run_dir):
    """Digests and head anchors for rows edited in place, as the pipe that wrote such rows
    would have made them (the ledger's check would otherwise refuse the folder)."""
    from runner.ledger.ledger import Ledger, _row_digest

    led = Ledger.read(run_dir)
    trials = led.trials()
    led.close()
    db = sqlite3.connect(run_dir / "ledger.db")
    prev = ""
    for t in trials:
        prev = _row_digest(prev, t)
        db.execute("UPDATE trials SET chain = ? WHERE id = ?", (prev, t.id))
    head = {"rows": trials[-1].id, "chain": prev}
    db.execute("UPDATE meta SET value = ? WHERE key = 'head'", (json.dumps(head),))
    db.commit()
    db.close()
    doc = json.loads((run_dir / "run.json").read_text())
    doc["ledger_head"] = head
    (run_dir / "run.json").write_text(json.dumps(doc))


def test_trials_judged_before_per_shape_digests_are_matched_through_the_stored_template(project, tmp_path):
    """A sweep begun before trials kept the digest of each shape's source: its verdicts are
    matched by rendering their configurations again from the template that run stored; a run
    that stored no template offers none."""
    spec, tpl, text = _project(project)
    a = tmp_path / "a"
    only = ["--only", "THREADS=1", "--only", "ACC=1", "--only", "UNROLL=1,2,4"]
    r = pipe_main("record", str(spec), "--run-dir", str(a), "--out", str(tmp_path / "a.json"), *only, cwd=project)
    assert r.returncode == 0, r.stderr
    db = sqlite3.connect(a / "ledger.db")  # as such a run would have written it
    db.execute("DROP TRIGGER trials_no_update")
    db.execute("UPDATE trials SET details = json_remove(details, '$.sources_hash')")
    db.commit()
    db.close()
    _rechain(a)
    assert all("sources_hash" not in t["details"] for t in _trials(a))
    tpl.write_text(text.replace(MARK, "{% if UNROLL == 4 %}// unrolled four times\n{% endif %}" + MARK))
    r = pipe_main("record", str(spec), "--run-dir", str(tmp_path / "b"), "--out", str(tmp_path / "b.json"), *only,
                  "--reuse", str(a), cwd=project)
    assert r.returncode == 0, r.stderr
    assert "2 verdicts reused" in r.stdout
    db = sqlite3.connect(a / "ledger.db")
    db.execute("DELETE FROM meta WHERE key = 'template'")
    db.commit()
    db.close()
    r = pipe_main("record", str(spec), "--run-dir", str(tmp_path / "c"), "--out", str(tmp_path / "c.json"), *only,
                  "--reuse", str(a), cwd=project)
    assert r.returncode == 0, r.stderr
    assert "0 verdicts of" in r.stdout and "verdicts reused" not in r.stdout


def test_faults_and_trials_of_another_compiler_or_judge_are_judged_again(project, tmp_path):
    """A fault or hang may have been the machine's, and a trial judged with another compiler
    or judge code (the digest each trial keeps) may not stand: both are judged again."""
    spec, _, _ = _project(project)
    a = tmp_path / "a"
    only = ["--only", "THREADS=1", "--only", "ACC=1", "--only", "UNROLL=1,2,4"]
    r = pipe_main("record", str(spec), "--run-dir", str(a), "--out", str(tmp_path / "a.json"), *only, cwd=project)
    assert r.returncode == 0, r.stderr
    ids = [t["id"] for t in _trials(a)]
    assert all("made_with" in t["details"] for t in _trials(a))
    db = sqlite3.connect(a / "ledger.db")
    db.execute("DROP TRIGGER trials_no_update")
    db.execute("UPDATE trials SET status = 'fault' WHERE id = ?", (ids[0],))
    db.execute("UPDATE trials SET details = json_set(details, '$.made_with', 'another') WHERE id = ?", (ids[1],))
    db.commit()
    db.close()
    _rechain(a)
    b = tmp_path / "b"
    r = pipe_main("record", str(spec), "--run-dir", str(b), "--out", str(tmp_path / "b.json"), *only,
                  "--reuse", str(a), cwd=project)
    assert r.returncode == 0, r.stderr
    assert "1 verdicts reused" in r.stdout
    reused = [t["details"].get("reused_from", {}).get("trial") for t in _trials(b)]
    assert reused == [None, None, ids[2]]
