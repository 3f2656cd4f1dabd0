"""Data files of the wrong shape (a replay dataset, a run folder's compare.json) and bad
arguments to `pipe replay` and `pipe merge`: each is a clear error that names the file and the
key path of the problem, exit 2, never a traceback. And the files as they are still work."""

import copy
import json
import shutil
import subprocess
import sys

import pytest

from runner.search import dataset

from .conftest import ROOT, pipe_main

DATASET = ROOT / "datasets" / "rmsnorm-cpu.json"  # the smallest recording: 36 configurations, 2 timed shapes
H200_RUN = ROOT / "tests" / "data" / "rmsnorm-h200-run"  # a real run with its compare.json (4 shapes)
H200_SPEC = H200_RUN / "project" / "pipelines" / "rmsnorm-h200.yaml"  # the spec as it was for the run


def _data() -> dict:
    return json.loads(DATASET.read_text())


def _write(tmp_path, name, doc) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def _refused(r, *needles):
    """Exit 2, one clear message, no traceback, and every needle in it."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Error:" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def _set(path: str, value):
    """A change to a dataset: the value at a key path (a.b[3].c) replaced."""
    def change(d):
        keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
        at = d
        for k in keys[:-1]:
            at = at[k]
        at[keys[-1]] = value
        return d
    return change


def _drop(path: str):
    def change(d):
        *head, last = path.split(".")
        at = d
        for k in head:
            at = at[int(k)] if k.isdigit() else at[k]
        del at[last]
        return d
    return change


# (what is changed, the key path and what the message says there)
BROKEN_DATASETS = {
    "top_list": (lambda d: [1, 2], "expected a JSON object at the top, got a list"),
    "no_format": (_drop("format"), "format: missing"),
    "trials_string": (_set("trials", "oops"), "trials: expected a list of objects, got a string"),
    "params_string": (_set("params", "x"), "params: expected an object"),
    "param_values_empty": (_set("params.ACC", []), "params.ACC: expected a list of values, got an empty list"),
    "param_value_object": (_set("params.ACC", [1, {"a": 1}]), "params.ACC[1]: expected a number, string or boolean"),
    "constraints_string": (_set("constraints", "ACC > 1"), "constraints: expected a list"),
    "constraint_syntax": (_set("constraints", ["ACC >"]), "constraints[0]: 'ACC >': syntax error"),
    "shape_number": (_set("shapes", [1, 2]), "shapes[0]: expected an object"),
    "shape_size_string": (_set("shapes[1].N", "big"), "shapes[1].N: expected a number, got a string"),
    "timed_shapes_too_many": (_set("timed_shapes", 9), "timed_shapes: expected 0 to 5"),
    "trial_string": (_set("trials[3]", "x"), "trials[3]: expected an object, got a string"),
    "trial_params_string": (_set("trials[3].params", "x"), "trials[3].params: expected an object, got a string"),
    "trial_no_params": (_drop("trials.3.params"), "trials[3].params: missing"),
    "trial_no_objective": (_drop("trials.3.objective"), "trials[3].objective: missing"),
    "trial_status_number": (_set("trials[0].status", 1), "trials[0].status: expected a string, got 1"),
    "objective_string": (_set("trials[2].objective", "fast"), "trials[2].objective: expected a positive number"),
    "times_string": (lambda d: {**d, "trials": [{**t, "times": "x"} for t in d["trials"]]},
                     "trials[0].times: expected a list"),
    "time_string": (_set("trials[3].times[1]", "x"), "trials[3].times[1]: expected a positive number (seconds) "
                                                    "or null, got a string"),
    "time_negative": (_set("trials[3].times[0]", -1), "trials[3].times[0]: expected a positive number (seconds) "
                                                      "or null, got -1"),
    "times_short": (_set("trials[5].times", [1e-3]), "trials[5].times: expected a time for each of the 2 timed"),
}


@pytest.mark.parametrize("case", BROKEN_DATASETS)
def test_replay_refuses_a_dataset_of_the_wrong_shape(case, tmp_path):
    change, says = BROKEN_DATASETS[case]
    path = _write(tmp_path, f"{case}.json", change(copy.deepcopy(_data())))
    r = pipe_main("replay", path, "--seeds", "1", "--agent", "random")
    _refused(r, f"{path}: not a pipe-dataset/1 dataset: {says}")
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case", ["trials_string", "time_string", "trial_params_string"])
def test_merge_refuses_a_dataset_of_the_wrong_shape(case, tmp_path):
    change, says = BROKEN_DATASETS[case]
    good = _write(tmp_path, "good.json", _data())
    bad = _write(tmp_path, f"{case}.json", change(copy.deepcopy(_data())))
    out = tmp_path / "merged.json"
    r = pipe_main("merge", good, bad, "--out", out)
    _refused(r, f"{bad}: not a pipe-dataset/1 dataset: {says}")
    assert not out.exists()


def test_merge_refuses_non_numeric_times_so_replay_never_sees_them(tmp_path):
    """Finding 7: such a merge used to exit 0 and write a file that crashed replay."""
    d = _data()
    bad = _write(tmp_path, "times_str.json", {**d, "trials": [{**t, "times": ["x", "y"]} for t in d["trials"]]})
    out = tmp_path / "m.json"
    r = pipe_main("merge", str(DATASET), bad, "--out", out)
    _refused(r, bad, "trials[0].times[0]: expected a positive number")
    assert not out.exists()


def test_merge_names_the_key_path_not_python(tmp_path):
    for doc, says in (([1, 2], "expected a JSON object at the top, got a list"),
                      ({**_data(), "params": "x"}, "params: expected an object")):
        bad = _write(tmp_path, "bad.json", doc)
        r = pipe_main("merge", str(DATASET), bad, "--out", tmp_path / "o.json")
        _refused(r, bad, says)
        assert "attribute" not in r.stderr and "object has no" not in r.stderr


def test_merge_refuses_an_output_that_is_one_of_its_inputs(tmp_path):
    """dataset.merge's `out`: the file its caller will write, refused where it is an input
    (spelt any way), so that `pipe merge A A --out A` cannot overwrite A with a "merge" of itself."""
    a = tmp_path / "a.json"
    shutil.copy(DATASET, a)
    for out in (a, tmp_path / "." / "a.json"):
        with pytest.raises(dataset.MergeError, match=r"--out .*: is the input .*a\.json; write the merge to a new"):
            dataset.merge([str(a), str(a)], out=str(out))
    assert dataset.merge([str(a), str(a)], out=str(tmp_path / "o.json")).data["trials"]  # a new file: fine


def test_pipe_merge_of_a_file_with_itself_leaves_it_alone(tmp_path):
    a = tmp_path / "a.json"
    shutil.copy(DATASET, a)
    before = a.read_bytes()
    r = pipe_main("merge", a, a, "--out", a)
    assert a.read_bytes() == before
    _refused(r, f"--out {a}: is the input {a}")


def test_merge_of_a_folder_says_so(tmp_path):
    r = pipe_main("merge", str(DATASET), tmp_path, "--out", tmp_path / "o.json")
    _refused(r, f"{tmp_path}: a folder, not a dataset file")


def test_merge_and_replay_of_good_parts_still_work(tmp_path):
    d = _data()
    a = _write(tmp_path, "a.json", {**d, "trials": d["trials"][:18]})
    b = _write(tmp_path, "b.json", {**d, "trials": d["trials"][18:]})
    out = tmp_path / "merged.json"
    r = pipe_main("merge", a, b, "--out", out)
    assert r.returncode == 0, r.stderr
    assert f"merged {len(d['trials'])} configurations" in r.stdout
    r = pipe_main("replay", out, "--seeds", "2", "--agent", "random")
    assert r.returncode == 0, r.stderr
    assert "merged: 36 valid configurations, 2 seeds" in r.stdout


def test_replay_of_a_shipped_dataset_still_works():
    r = pipe_main("replay", DATASET, "--seeds", "2", "--agent", "random,grid")
    assert r.returncode == 0, r.stderr
    assert "rmsnorm-cpu: 36 valid configurations, 2 seeds" in r.stdout and r.stderr == ""


def test_every_committed_recording_passes_the_check():
    for f in sorted((ROOT / "datasets").rglob("*.json")):
        doc = json.loads(f.read_text())
        if isinstance(doc, dict) and doc.get("format") == dataset.FORMAT:
            assert dataset.check(doc) is None, f


@pytest.mark.parametrize("seeds", ["0", "-3"])
def test_replay_needs_a_seed(seeds):
    r = pipe_main("replay", DATASET, "--seeds", seeds, "--agent", "random")
    _refused(r, f"--seeds: {seeds} is not a positive number of simulated runs")
    assert "median" not in r.stderr


@pytest.mark.parametrize("seeds", [0, -3, []])
def test_replay_functions_need_a_seed_too(seeds):
    """The library's own check, behind the CLI's: replay, replay_patience and bench."""
    from runner.search import replay as rp

    for call in (lambda: rp.replay(DATASET, "random", seeds), lambda: rp.replay_patience(DATASET, "random", seeds, 3),
                 lambda: rp.bench([DATASET], ["random"], seeds)):
        with pytest.raises(rp.ReplayError, match="--seeds: "):
            call()


@pytest.mark.parametrize("agent", [",", ""])
def test_replay_needs_a_strategy(agent):
    r = pipe_main("replay", DATASET, "--seeds", "1", "--agent", agent)
    _refused(r, "--agent: no strategy named")
    assert "(no datasets)" not in r.stdout


def test_replay_of_a_broken_dataset_in_a_real_process(tmp_path):
    """The process itself: what pipe_main cannot show (an exception would fail it before stderr)."""
    path = _write(tmp_path, "list.json", [1, 2])
    r = subprocess.run([sys.executable, "-m", "runner.cli", "replay", path, "--seeds", "1", "--agent", "random"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    _refused(r, path, "expected a JSON object at the top")


# compare.json in a run folder: `pipe report` (and export, through rundata.open_run) read it

def _run_with_compare(tmp_path, change) -> str:
    """A copy of the checked-in H200 run whose compare.json is changed by `change`."""
    work = tmp_path / "run"
    work.mkdir()
    for n in ("ledger.db", "run.json", "trials.tsv"):
        shutil.copy(H200_RUN / n, work / n)
    doc = json.loads((H200_RUN / "compare.json").read_text())
    (work / "compare.json").write_text(json.dumps(change(doc)))
    return str(work)


def _shapes(f):
    """A change to every entry of compare.json's shapes."""
    return lambda d: {**d, "shapes": [f(s) for s in d["shapes"]]}


BROKEN_COMPARES = {
    "shape_empty": (lambda d: {**d, "shapes": [{}]}, "shapes[0].label: missing"),
    "shapes_string": (lambda d: {**d, "shapes": "x"}, "shapes: expected a list, got a string"),
    "time_string": (_shapes(lambda s: {**s, "tuned": {**s["tuned"], "time_s": "fast"}}),
                    "shapes[0].tuned.time_s: expected a positive number (seconds), got a string"),
    "tuned_no_trial": (_shapes(lambda s: {**s, "tuned": {k: v for k, v in s["tuned"].items() if k != "trial"}}),
                       "shapes[0].tuned.trial: missing"),
    "arms_list": (_shapes(lambda s: {**s, "arms": []}), "shapes[0].arms: expected an object, got a list"),
    "arm_speedup_string": (_shapes(lambda s: {**s, "arms": {**s["arms"], "torch eager": {
        **s["arms"]["torch eager"], "tuned_speedup": "2x"}}}),
        'shapes[0].arms["torch eager"].tuned_speedup: expected a number, got a string'),
    "arm_range_short": (_shapes(lambda s: {**s, "arms": {**s["arms"], "triton": {
        **s["arms"]["triton"], "tuned_speedup_range": [1.0]}}}),
        "shapes[0].arms.triton.tuned_speedup_range: expected 2 entries, got 1"),
    "machine_string": (lambda d: {**d, "machine": "h200"}, "machine: expected an object, got a string"),
    "held_out_item": (lambda d: {**d, "held_out": [{"label": "1x1"}]}, "held_out[0].choice: missing"),
    "range_table_list": (lambda d: {**d, "range_table": []}, "range_table: expected an object, got a list"),
    "fewer_shapes": (lambda d: {**d, "shapes": d["shapes"][:2]},
                     "shapes: expected 4 entries (the spec's timed shapes), got 2"),
}


@pytest.mark.parametrize("case", BROKEN_COMPARES)
def test_report_refuses_a_damaged_compare_json(case, tmp_path):
    change, says = BROKEN_COMPARES[case]
    run = _run_with_compare(tmp_path, change)
    r = pipe_main("report", run, "--out", tmp_path / "out", "--spec", H200_SPEC, cwd=ROOT)
    _refused(r, f"{run}/compare.json: not a pipe compare result ({says}); run pipe compare again or remove it")


def test_report_of_a_damaged_compare_json_in_a_real_process(tmp_path):
    run = _run_with_compare(tmp_path, BROKEN_COMPARES["time_string"][0])
    r = subprocess.run([sys.executable, "-m", "runner.cli", "report", run, "--out", str(tmp_path / "out"),
                        "--spec", str(H200_SPEC)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    _refused(r, f"{run}/compare.json", "shapes[0].tuned.time_s")


def test_report_with_an_intact_compare_json_still_works(tmp_path):
    run = _run_with_compare(tmp_path, lambda d: d)
    r = pipe_main("report", run, "--out", tmp_path / "out", "--spec", H200_SPEC, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Per-shape figures from `pipe compare`" in md and "32768x4096" in md


def test_a_shape_without_a_tuned_kernel_is_no_damage(tmp_path):
    """tuned: null is what pipe compare writes where no candidate ran; the report goes on."""
    run = _run_with_compare(tmp_path, _shapes(lambda s: {**s, "tuned": None}))
    r = pipe_main("report", run, "--out", tmp_path / "out", "--spec", H200_SPEC, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_every_committed_compare_json_passes_the_check():
    from runner.ship.rundata import check_compare

    files = [f for d in ("datasets", "runs", "tests/data") for f in (ROOT / d).rglob("compare.json")]
    assert files
    for f in files:
        assert check_compare(json.loads(f.read_text())) is None, f
