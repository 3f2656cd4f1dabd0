"""`pipe merge`: datasets of one spec recorded in parts (pipe record --only) joined into one.
Small synthetic datasets, no GPU."""

import json
import subprocess
import sys

import pytest

from runner import cli
from runner.search import dataset
from runner.search import replay as rp
from runner.search.space import config_key

from .conftest import ROOT

SHAPES = [{"M": 64, "N": 128}, {"M": 8, "N": 4096}, {"M": 3, "N": 33}]  # the last one held out


def trial(ept, vec, times, status="ok"):
    ok = status == "ok"
    return {"params": {"EPT": ept, "VEC": vec}, "status": status, "reason": "" if ok else "mismatch",
            "times": times if ok else None,
            "objective": (times[0] * times[1]) ** 0.5 if ok else None}


def ds(epts, vecs, trials, **over):
    d = {"format": "pipe-dataset/1", "spec": "toy", "spec_hash": "0123456789abcdef", "hardware": "h200",
         "created": "2026-01-01T00:00:00Z", "machine": {"gpu": "NVIDIA H200", "torch": "2.11"},
         "params": {"EPT": epts, "VEC": vecs}, "constraints": ["EPT >= VEC"],
         "shapes": SHAPES, "timed_shapes": 2, "trials": trials}
    d.update(over)
    return d


def write(tmp_path, name, d):
    p = tmp_path / name
    p.write_text(json.dumps(d, indent=1) + "\n")
    return str(p)


def grid(epts, vecs, scale=1.0, skip=()):
    return [trial(e, v, [scale * e * 1e-6 / v, scale * 2e-6 * v / e, 1e-6])
            for e in epts for v in vecs if e >= v and (e, v) not in skip]


@pytest.fixture
def parts(tmp_path):
    """Part 0: EPT 8,16 (the older sweep); part 1: EPT 16,32, 10% slower where it overlaps at EPT 16,
    and one verdict at EPT 16 that went from ok to fail."""
    a = ds([8, 16], [4, 8], grid([8, 16], [4, 8]), created="2026-01-01T00:00:00Z",
           machine={"gpu": "NVIDIA H200", "host": "a"})
    b_trials = grid([16, 32], [4, 8], scale=1.1, skip={(16, 8)}) + [trial(16, 8, None, status="fail")]
    b = ds([16, 32], [4, 8], b_trials, created="2026-02-01T00:00:00Z",
           machine={"gpu": "NVIDIA H200", "host": "b"})
    return write(tmp_path, "a.json", a), write(tmp_path, "b.json", b), a, b


def test_union_later_wins_and_parts(parts, tmp_path, capsys):
    pa, pb, a, b = parts
    out = tmp_path / "sub" / "merged.json"
    assert cli.main(["merge", pa, pb, "--out", str(out)]) == cli.EXIT_OK
    m = json.loads(out.read_text())
    keys = {config_key(t["params"]): t for t in m["trials"]}
    # the union: EPT 8, 16, 32 with VEC 4, 8 (EPT >= VEC everywhere), each once
    assert len(m["trials"]) == len(keys) == 6
    assert {(t["params"]["EPT"], t["params"]["VEC"]) for t in m["trials"]} == \
        {(8, 4), (8, 8), (16, 4), (16, 8), (32, 4), (32, 8)}
    # only in the first file: part 0 with its own times
    assert keys[config_key({"EPT": 8, "VEC": 4})]["part"] == 0
    assert keys[config_key({"EPT": 8, "VEC": 4})]["times"] == a["trials"][0]["times"]
    # in both: the later file wins, status and times
    k16_4 = keys[config_key({"EPT": 16, "VEC": 4})]
    assert k16_4["part"] == 1
    assert k16_4["times"] == pytest.approx(grid([16], [4], scale=1.1)[0]["times"])
    assert k16_4["times"] != pytest.approx(grid([16], [4])[0]["times"])
    k16_8 = keys[config_key({"EPT": 16, "VEC": 8})]
    assert k16_8["part"] == 1 and k16_8["status"] == "fail" and k16_8["times"] is None
    assert keys[config_key({"EPT": 32, "VEC": 8})]["part"] == 1
    # the inputs are not changed
    assert "part" not in json.loads((tmp_path / "a.json").read_text())["trials"][0]
    # parts: one per input, in command-line order
    assert [p["file"] for p in m["parts"]] == [pa, pb]
    assert [p["created"] for p in m["parts"]] == ["2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"]
    assert [p["machine"]["host"] for p in m["parts"]] == ["a", "b"]
    assert [p["trials"] for p in m["parts"]] == [2, 4]
    assert [p["recorded"] for p in m["parts"]] == [4, 4]
    # top level: the merge's time, the last input's machine, the rest from the first
    assert m["created"] not in ("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z")
    assert len(m["created"]) == len("2026-01-01T00:00:00Z") and m["created"].endswith("Z")
    assert m["machine"]["host"] == "b"
    assert m["spec_hash"] == a["spec_hash"] and m["timed_shapes"] == 2 and m["shapes"] == SHAPES
    assert out.read_text().endswith("}\n") and out.read_text() == dataset.dumps(m)  # compact, a trial a line
    stdout = capsys.readouterr().out
    assert f"merged 6 configurations from 2 files to {out} (part 0: 2, part 1: 4)" in stdout


def test_params_union_order(tmp_path):
    # VEC: the longest list (the second file's) gives the order; 2 (only in the first) and
    # 1 (only in the third) are appended in the order the files give them.
    a = ds([16], [2, 8], [trial(16, 2, [1e-6, 1e-6, 1e-6])])
    b = ds([32], [8, 4, 16], [trial(32, 4, [1e-6, 1e-6, 1e-6])])
    c = ds([8, 16], [1, 4], [trial(8, 1, [1e-6, 1e-6, 1e-6])])
    paths = [write(tmp_path, n, d) for n, d in (("a.json", a), ("b.json", b), ("c.json", c))]
    m = dataset.merge(paths).data
    assert m["params"]["VEC"] == [8, 4, 16, 2, 1]
    # EPT: the third file's list is the longest; 32 (only in the second) comes after it
    assert m["params"]["EPT"] == [8, 16, 32]
    assert list(m["params"]) == ["EPT", "VEC"]


def test_params_union_ties_take_the_first(tmp_path):
    a = ds([32, 64], [4], [trial(32, 4, [1e-6, 1e-6, 1e-6])])
    b = ds([8, 16], [4], [trial(8, 4, [1e-6, 1e-6, 1e-6])])
    m = dataset.merge([write(tmp_path, "a.json", a), write(tmp_path, "b.json", b)]).data
    assert m["params"]["EPT"] == [32, 64, 8, 16]


def test_spec_hash_mismatch_is_an_input_error(parts, tmp_path, capsys):
    pa, _, a, _ = parts
    other = write(tmp_path, "other.json", ds([8], [4], grid([8], [4]), spec_hash="fedcba9876543210"))
    out = tmp_path / "merged.json"
    assert cli.main(["merge", pa, other, "--out", str(out)]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert pa in err and other in err and "spec_hash" in err
    assert not out.exists()


def test_mismatch_through_a_real_process(parts, tmp_path):
    pa, _, _, _ = parts
    other = write(tmp_path, "other.json", ds([8], [4], grid([8], [4]), timed_shapes=3))
    r = subprocess.run([sys.executable, "-m", "runner.cli", "merge", pa, other, "--out", str(tmp_path / "o.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == cli.EXIT_INPUT
    assert "Traceback" not in r.stderr
    assert "timed_shapes" in r.stderr and pa in r.stderr and other in r.stderr


@pytest.mark.parametrize("field,value", [("spec", "other"), ("hardware", "b200"), ("constraints", []),
                                         ("shapes", SHAPES[:2]), ("format", "pipe-dataset/0")])
def test_every_field_must_match(parts, tmp_path, field, value, capsys):
    pa, _, _, _ = parts
    other = write(tmp_path, "other.json", ds([8], [4], grid([8], [4]), **{field: value}))
    assert cli.main(["merge", pa, other, "--out", str(tmp_path / "o.json")]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert "Traceback" not in err and other in err
    assert field in err or "not a pipe-dataset/1" in err  # a wrong format fails dataset.load first


def test_different_parameter_names(parts, tmp_path, capsys):
    pa, _, _, _ = parts
    d = ds([8], [4], [{"params": {"EPT": 8, "VEC": 4, "X": 1}, "status": "ok", "reason": "",
                       "times": [1e-6, 1e-6, 1e-6], "objective": 1e-6}])
    d["params"]["X"] = [1]
    other = write(tmp_path, "other.json", d)
    assert cli.main(["merge", pa, other, "--out", str(tmp_path / "o.json")]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert "'params'" in err and "X" in err and pa in err and other in err


def test_missing_and_unreadable_files(parts, tmp_path, capsys):
    pa, _, _, _ = parts
    missing = str(tmp_path / "nope.json")
    assert cli.main(["merge", pa, missing, "--out", str(tmp_path / "o.json")]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert missing in err and "no such dataset" in err and "Traceback" not in err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert cli.main(["merge", pa, str(bad), "--out", str(tmp_path / "o.json")]) == cli.EXIT_INPUT
    err = capsys.readouterr().err
    assert str(bad) in err and "cannot load" in err
    assert cli.main(["merge", pa, "--out", str(tmp_path / "o.json")]) == cli.EXIT_INPUT
    assert "at least two" in capsys.readouterr().err


def test_overlap_ratios_printed(parts, tmp_path, capsys):
    pa, pb, _, _ = parts
    assert cli.main(["merge", pa, pb, "--out", str(tmp_path / "o.json")]) == cli.EXIT_OK
    stdout = capsys.readouterr().out
    # (16, 4) and (16, 8) are in both files; (16, 8) failed in the second, so one timed pair
    assert "overlap: 2 configurations in more than one file; 1 timed in both; 1 with a different verdict" \
        in stdout
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("shape ")]
    assert len(lines) == 2  # the timed shapes only, not the held-out one
    assert lines[0].strip().startswith("shape 0 (M=64, N=128)")
    assert "median 1.1000, min 1.1000, max 1.1000" in lines[0] and "median 1.1000" in lines[1]


def test_overlap_ratio_statistics(tmp_path):
    a = ds([8, 16], [4], [trial(8, 4, [1e-6, 2e-6, 1e-6]), trial(16, 4, [1e-6, 2e-6, 1e-6])])
    b = ds([8, 16], [4], [trial(8, 4, [2e-6, 2e-6, 9e-6]), trial(16, 4, [0.5e-6, 3e-6, 9e-6])])
    c = ds([8], [4], [trial(8, 4, [3e-6, 2e-6, 9e-6])])
    m = dataset.merge([write(tmp_path, n, d) for n, d in (("a.json", a), ("b.json", b), ("c.json", c))])
    # each trial against the one it replaces: b/a for both, then c/b for EPT 8
    assert m.overlap == 3 and m.differ == 0
    assert sorted(m.ratios[0]) == pytest.approx([0.5, 1.5, 2.0])
    assert sorted(m.ratios[1]) == pytest.approx([1.0, 1.0, 1.5])
    assert len(m.ratios) == 2
    text = "\n".join(dataset.overlap_lines(m))
    assert "median 1.5000, min 0.5000, max 2.0000" in text
    assert [t["part"] for t in m.data["trials"]] == [2, 1]


def test_no_overlap(tmp_path, capsys):
    a = ds([8], [4], grid([8], [4]))
    b = ds([16], [4], grid([16], [4]))
    out = tmp_path / "o.json"
    assert cli.main(["merge", write(tmp_path, "a.json", a), write(tmp_path, "b.json", b),
                     "--out", str(out)]) == cli.EXIT_OK
    assert "overlap: none" in capsys.readouterr().out


def test_merged_file_loads_and_replays(parts, tmp_path, capsys):
    pa, pb, _, _ = parts
    out = tmp_path / "merged.json"
    assert cli.main(["merge", pa, pb, "--out", str(out)]) == cli.EXIT_OK
    d = dataset.load(out)
    assert [p.values for p in d.space.params] == [(8, 16, 32), (4, 8)]
    assert len(list(d.space)) == 6
    # the fastest: grid() times EPT/VEC and VEC/EPT; EPT 8 VEC 8 gives (1e-6, 2e-6)
    assert d.best == pytest.approx((1e-6 * 2e-6) ** 0.5)
    assert d.lookup({"EPT": 16, "VEC": 8})["status"] == "fail"
    assert d.lookup({"EPT": 32, "VEC": 4})["part"] == 1
    assert d.lookup({"EPT": 64, "VEC": 4})["status"] == "missing"
    r = rp.replay(d, "random", range(3))
    assert r["size"] == 6 and r["thresholds"][0.01]["missed"] == 0
    capsys.readouterr()
    assert cli.main(["replay", str(out), "--agent", "grid,random", "--seeds", "3", "--json"]) == cli.EXIT_OK
    res = json.loads(capsys.readouterr().out)
    assert [x["size"] for x in res] == [6, 6]
