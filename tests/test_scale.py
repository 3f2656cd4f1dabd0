"""Scale out (runner.scale): several judge workers, one driver writing the ledger.

On the CPU backend, `--workers N`: the same verdicts as one worker, every trial with its
slot, a worker killed mid-sweep losing nothing; `--gpus` without CUDA refused cleanly; the
Ray path on a real local cluster (slow, skipped without ray) with an actor killed mid-sweep."""

import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import yaml

from runner.core.errors import PipeError
from runner.scale import slots as slotmod

from .conftest import FEW_ROWS, PIPELINES, has_cuda, pipe_main

SPEC = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())


def small_spec(project: Path, accs=(1, 2, 4, 8)) -> str:
    d = json.loads(json.dumps(SPEC))
    d["op"]["shapes"] = FEW_ROWS
    d["search"]["params"]["ACC"] = list(accs)
    d["goal"] = {"budget": {"trials": 50}}
    (project / "pipelines" / "s.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    return "pipelines/s.yaml"


def rows(run_dir) -> list[tuple]:
    db = sqlite3.connect(f"file:{run_dir}/ledger.db?mode=ro", uri=True)
    try:
        return db.execute("SELECT id, params_key, status, details FROM trials ORDER BY id").fetchall()
    finally:
        db.close()


def verified(run_dir, cwd) -> dict:
    r = pipe_main("show", str(run_dir), "--json", cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(r.stdout)
    assert s["ledger"]["intact"], s["ledger"]
    return s


# --- no worker started ------------------------------------------------------------------

def test_core_sets_are_disjoint_until_they_wrap():
    sets, over = slotmod.core_sets(2, 1, [0, 1])
    assert sets == [[0], [1]] and not over
    sets, over = slotmod.core_sets(4, 1, [0, 1])
    assert sets == [[0], [1], [0], [1]] and over
    sets, over = slotmod.core_sets(2, 2, [0, 1, 2, 3])
    assert sets == [[0, 1], [2, 3]] and not over


def test_gpu_lists_and_unlike_devices_are_refused():
    assert slotmod.parse_gpus("all", 3) == [0, 1, 2]
    assert slotmod.parse_gpus("0,2", 3) == [0, 2]
    for bad in ("0,0", "5", "x", ""):
        with pytest.raises(PipeError):
            slotmod.parse_gpus(bad, 3)
    h200 = {"name": "NVIDIA H200", "sms": 132, "cc": "9.0", "memory_gib": 140}
    slotmod.same_profiles({"cuda:0": h200, "cuda:1": dict(h200)})
    with pytest.raises(PipeError, match="devices differ"):
        slotmod.same_profiles({"cuda:0": h200, "cuda:1": {**h200, "name": "NVIDIA H100", "sms": 114}})


def test_only_a_worker_killed_from_outside_is_lost():
    assert slotmod.lost_reason({"status": "fault", "reason": "worker died during the trial (signal SIGKILL)"})
    assert not slotmod.lost_reason({"status": "fault", "reason": "worker died during the trial (signal SIGSEGV)"})
    assert not slotmod.lost_reason({"status": "ok"})


@pytest.mark.skipif(has_cuda(), reason="this host has CUDA")
def test_gpus_without_cuda_is_a_clean_error(project):
    spec = small_spec(project)
    for cmd in ("run", "record"):
        r = pipe_main(cmd, spec, "--run-dir", "g", "--gpus", "all", cwd=project)
        assert r.returncode == 2, r.stderr
        assert "no CUDA device" in r.stderr and "Traceback" not in r.stderr
    assert not (project / "g").exists()  # refused before the run folder was made
    r = pipe_main("run", spec, "--run-dir", "g", "--workers", "0", cwd=project)
    assert r.returncode == 2 and "at least 1" in r.stderr


# --- real workers ---------------------------------------------------------------------------

@pytest.mark.slow
def test_two_workers_give_the_verdicts_of_one(project):
    spec = small_spec(project)
    got = {}
    for n in (1, 2):
        r = pipe_main("record", spec, "--run-dir", f"w{n}", "--out", f"w{n}.json", "--workers", str(n), "-q",
                      cwd=project)
        assert r.returncode == 0, r.stderr
        rs = rows(project / f"w{n}")
        keys = [k for _, k, _, _ in rs]
        assert len(keys) == len(set(keys)) == 12  # 4 ACC x 3 UNROLL, each exactly once
        slots = {json.loads(d)["slot"] for _, _, _, d in rs}
        assert slots <= {f"cpu:{i}" for i in range(n)}
        if n == 2:
            assert slots == {"cpu:0", "cpu:1"}  # both workers judged
        got[n] = {k: st for _, k, st, _ in rs}
        verified(project / f"w{n}", project)
    assert got[1] == got[2]


@pytest.mark.slow  # 16 s of the quick suite, which CI keeps under 10 minutes
def test_a_slot_finds_its_build_ahead_as_one_worker_does(project):
    """Scaled out, the driver compiles what the agent proposes next while the slots judge,
    as the one-worker loop does: on one slot every grid point after the first two was
    built ahead (`--gpus all` on a one-GPU host must not run slower than a plain run), and
    the proposals and verdicts are those of a run without it."""
    spec = small_spec(project, accs=(1, 2))
    got = {}
    for flag in ("1", "0"):
        r = pipe_main("record", spec, "--run-dir", f"a{flag}", "--out", f"a{flag}.json", "--workers", "1", "-q",
                      cwd=project, env={"PIPE_BUILD_AHEAD": flag, "PIPE_CACHE_DIR": str(project / f"cache{flag}")})
        assert r.returncode == 0, r.stderr
        rs = rows(project / f"a{flag}")
        got[flag] = [(k, st) for _, k, st, _ in rs]
        ahead = [bool(json.loads(d).get("built_ahead")) for _, _, _, d in rs]
        if flag == "1":
            assert len(rs) == 6 and sum(ahead) >= len(rs) - 2 and not ahead[0], ahead
        else:
            assert not any(ahead)
    assert got["1"] == got["0"]


def test_the_driver_plans_ahead_once_the_slots_trial_is_built(project, monkeypatch):
    """The plan of builds ahead starts after the slot's trial was built, not beside that build
    (where it takes the interpreter from it: on one H200 a trial's build grew from 1 to 40 ms
    and the sweep's rate fell by 9%); the plan still runs while the slot judges."""
    from runner import loop
    from runner.judge.evaluator import Evaluator
    from runner.spec.spec import load_spec

    small_spec(project, accs=(1, 2))
    spec = load_spec(str(project / "pipelines" / "s.yaml"))
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    real_run, real_plan = Evaluator.run, loop.Session._build_ahead

    def run(self, params, agent, variant=None, on_built=None):
        key = json.dumps(params, sort_keys=True)

        def built():
            with lock:
                events.append(("built", key))
            time.sleep(0.05)  # a plan started beside the build would land inside this window
            if on_built is not None:
                on_built()
        return real_run(self, params, agent, variant, on_built=built)

    def plan(self, p, vid):
        with lock:
            events.append(("plan", json.dumps(dict(p.params), sort_keys=True)))
        return real_plan(self, p, vid)

    monkeypatch.setattr(Evaluator, "run", run)
    monkeypatch.setattr(loop.Session, "_build_ahead", plan)
    monkeypatch.setenv("PIPE_BUILD_AHEAD", "1")
    # the driver's wait for the slot's build, long enough here that a slot thread starved of the
    # interpreter on a loaded machine (2 cores, 2 test workers) still reports its build first:
    # past BUILT_WAIT_S the plan starts beside the build by design, and the order is a race
    monkeypatch.setattr(loop, "BUILT_WAIT_S", 30.0)
    monkeypatch.setenv("PIPE_CACHE_DIR", str(project / "cache"))
    r = loop.record(spec, project / "o", project / "o.json", quiet=True, scale={"workers": 1})
    assert r["recorded"] == 6
    assert len([k for e, k in events if e == "plan"]) == 6
    db = sqlite3.connect(f"file:{project / 'o'}/ledger.db?mode=ro", uri=True)
    ahead = [json.dumps(json.loads(p), sort_keys=True)
             for p, d in db.execute("SELECT params, details FROM trials ORDER BY id")
             if json.loads(d).get("built_ahead")]
    db.close()
    assert len(ahead) >= 4  # the plans still built the next trials ahead
    # a trial built ahead is built in milliseconds, within the driver's wait: its plan follows
    # (one compiled from scratch may outlast BUILT_WAIT_S, and the plan then starts beside it)
    for k in ahead:
        assert events.index(("built", k)) < events.index(("plan", k)), events


def test_a_slot_whose_trial_fails_before_its_build_still_releases_the_driver():
    """A trial that never reaches its build (an error in the judge) sets the driver's event all
    the same: the driver's wait for it is bounded by the trial, not by BUILT_WAIT_S."""
    from runner import loop

    class Boom:
        def run(self, *a, **k):
            raise RuntimeError("render failed")

    ev = threading.Event()
    with pytest.raises(RuntimeError):
        loop._run_built_ahead(Boom(), loop.Proposal({"A": 1}), "grid", None, None, ev)
    assert ev.is_set()


def _killer(box: dict, stop: threading.Event, run_dir: Path, pid_of, min_rows: int = 1):
    """Kill (SIGKILL) the worker of a slot busy with a trial, once the ledger has a row."""
    while not stop.is_set():
        tsv = run_dir / "trials.tsv"
        n = len(tsv.read_text().splitlines()) - 1 if tsv.exists() else 0
        if n >= min_rows and box.get("slots"):
            for sl in box["slots"]:
                since = sl.busy_since
                if since is not None and time.monotonic() - since > 0.05:
                    pid = pid_of(sl)
                    if pid:
                        os.kill(pid, signal.SIGKILL)
                        box["killed"] = sl.name
                        return
        time.sleep(0.01)


def _capture(monkeypatch, box):
    real = slotmod.make_slots

    def make(*a, **k):
        box["slots"] = real(*a, **k)
        return box["slots"]
    monkeypatch.setattr(slotmod, "make_slots", make)


def _record_while_killing(monkeypatch, project, name: str, scale: dict, min_rows: int = 1):
    """`pipe record` of the small spec with `scale`, one worker killed (SIGKILL) while busy
    once the ledger holds `min_rows` rows: (the record's summary, the killer's box, the run
    folder), every trial asserted judged exactly once and ok."""
    from runner import loop
    from runner.spec.spec import load_spec

    small_spec(project)
    spec = load_spec(str(project / "pipelines" / "s.yaml"))
    box, stop = {}, threading.Event()
    _capture(monkeypatch, box)
    run_dir = project / name
    th = threading.Thread(target=_killer, args=(box, stop, run_dir, lambda sl: sl.pid, min_rows))
    th.start()
    try:
        r = loop.record(spec, run_dir, project / f"{name}.json", quiet=True, scale=scale)
    finally:
        stop.set()
        th.join()
    assert box.get("killed"), "no worker was killed while busy"
    rs = rows(run_dir)
    keys = [k for _, k, _, _ in rs]
    assert len(keys) == len(set(keys)) == 12 and r["recorded"] == 12
    assert all(st == "ok" for _, _, st, _ in rs)
    return r, box, run_dir


@pytest.mark.slow
def test_a_worker_killed_mid_sweep_loses_no_trial(project, monkeypatch):
    r, box, run_dir = _record_while_killing(monkeypatch, project, "k", {"workers": 2})
    rs = rows(run_dir)
    retried = [json.loads(d) for _, _, _, d in rs if "retried_after" in json.loads(d)]
    assert len(retried) == 1 and "SIGKILL" in retried[0]["retried_after"][0]
    verified(run_dir, project)


@pytest.mark.slow
def test_ray_cluster_with_an_actor_killed_mid_sweep(project, monkeypatch):
    ray = pytest.importorskip("ray")
    try:
        r, box, run_dir = _record_while_killing(monkeypatch, project, "ray", {"ray": "local", "workers": 2}, 2)
    finally:
        ray.shutdown()
    details = [json.loads(d) for _, _, _, d in rows(run_dir)]
    assert all(d["slot"].startswith("ray:") for d in details)
    assert box["killed"] in {sl.name for sl in box["slots"]}
    retried = [d for d in details if "retried_after" in d]
    assert len(retried) == 1 and retried[0]["slot"] != box["killed"]
    verified(run_dir, project)


def test_ray_missing_is_refused_before_the_run_folder_is_made(tmp_path, monkeypatch):
    import importlib.util

    from .conftest import ROOT, pipe_main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    run = tmp_path / "run"
    r = pipe_main("run", "pipelines/rmsnorm-cpu.yaml", "--ray", "auto", "--run-dir", str(run), cwd=ROOT)
    assert r.returncode == 2 and "--ray needs Ray" in r.stderr and "Traceback" not in r.stderr
    assert not run.exists()  # no stub folder for `pipe runs` to list


def test_a_ray_address_where_nothing_answers_is_refused_at_once(tmp_path, monkeypatch):
    """ray.init retries a wrong address for ever: a typo in --ray hung the run with no word. A TCP
    connection to the address answers first, before the run folder is made."""
    import importlib.util
    import socket

    from runner.scale.ray_slots import unreachable
    from .conftest import ROOT, pipe_main

    with socket.socket() as srv:  # a port that answers, then one that does not
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert unreachable(f"127.0.0.1:{port}") is None and unreachable(f"ray://127.0.0.1:{port}") is None
    assert "nothing answers at 127.0.0.1" in unreachable(f"127.0.0.1:{port}", timeout=2)
    assert "expected HOST:PORT" in unreachable("bogus")
    real = importlib.util.find_spec  # with or without Ray installed: the address is judged first
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "ray" else real(name, *a))
    run = tmp_path / "run"
    t0 = time.monotonic()
    r = pipe_main("run", "pipelines/rmsnorm-cpu.yaml", "--ray", f"127.0.0.1:{port}", "--run-dir", str(run), cwd=ROOT)
    assert r.returncode == 2 and "cannot reach a Ray cluster: nothing answers" in r.stderr, r.stderr[-800:]
    assert time.monotonic() - t0 < 30 and not run.exists()


def test_slots_that_cannot_start_leave_no_stub_run_folder(tmp_path, monkeypatch):
    """A scaled-out run whose slots fail to start (no Ray cluster at `auto`, say) ends before its
    first trial: what opening the folder made is taken back, and nothing else in it is touched."""
    from runner.core.errors import PipeError
    from runner.scale import slots
    from .conftest import ROOT, pipe_main

    def no_slots(*a, **k):
        raise PipeError("--ray auto: cannot reach a Ray cluster (test)")

    monkeypatch.setattr(slots, "make_slots", no_slots)
    run = tmp_path / "run"
    r = pipe_main("run", "pipelines/rmsnorm-cpu.yaml", "--workers", "2", "--run-dir", str(run), cwd=ROOT)
    assert r.returncode == 2 and "cannot reach a Ray cluster (test)" in r.stderr
    assert not run.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    r = pipe_main("run", "pipelines/rmsnorm-cpu.yaml", "--workers", "2", "--run-dir", str(mine), cwd=ROOT)
    assert r.returncode == 2 and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_a_ray_slot_ships_a_variants_approved_build_with_its_artifacts():
    """A variant's evaluate job names the approved template's build (`approved`), which the
    worker runs beside it: a remote slot copies those files too and rewrites both lists."""
    from runner.scale.ray_slots import artifact_paths, rewrite

    job = {"seed": 1, "artifacts": ["/a/v0.so", "/a/v0.so"], "approved": ["/a/ok.so", "/a/ok.so"], "geometry": []}
    assert artifact_paths(("evaluate", job)) == ["/a/v0.so", "/a/ok.so"]
    kind, got = rewrite(("evaluate", job), {"/a/v0.so": "/r/v0.so", "/a/ok.so": "/r/ok.so"})[:2]
    assert kind == "evaluate" and got["artifacts"] == ["/r/v0.so"] * 2 and got["approved"] == ["/r/ok.so"] * 2
    plain = {"seed": 1, "artifacts": ["/a/p.so"], "geometry": []}  # the approved template's own trial
    assert artifact_paths(("evaluate", plain)) == ["/a/p.so"]
    assert "approved" not in rewrite(("evaluate", plain), {"/a/p.so": "/r/p.so"})[1]


def test_an_actor_that_did_not_start_is_told_in_one_line():
    """What Ray brings back from an actor that failed to start (a remote traceback in its text)
    becomes one line: the remote error's own (the README's Ray command on a head with no CUDA
    printed 12 lines of traceback after pipe's own)."""
    from runner.scale.ray_slots import remote_why

    remote = ("ray::JudgeActor.info() (pid=1, ip=192.0.2.2)\n  File \"w.py\", line 3, in info\n"
              "    torch.cuda.init()\nAssertionError: Torch not compiled with CUDA enabled\n")

    class TaskError(Exception):
        def __init__(self, text, cause=None):
            super().__init__(text)
            self.cause = cause

    got = remote_why(TaskError("RayTaskError(AssertionError): " + remote, AssertionError("Torch not compiled "
                                                                                        "with CUDA enabled")))
    assert got == "AssertionError: Torch not compiled with CUDA enabled"
    got = remote_why(TaskError("RayTaskError(AssertionError): " + remote))  # no cause kept: the last line
    assert got == "AssertionError: Torch not compiled with CUDA enabled"
    assert remote_why(TimeoutError("no answer\nafter 60 s")) == "TimeoutError: no answer"
