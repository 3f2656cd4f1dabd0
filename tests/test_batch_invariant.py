"""Batch invariance (op.batch_invariant, issue 21 item 5): the deterministic mode.

The op is ragged column sums on the CPU (x [B, L, 8], lens [B] -> out [B, 8]: each
sequence b summed over its first lens[b] positions), whose kernel (tests/data/batch_inv.cpp.j2)
sums each half of a sequence into a scratch workspace ws[B, 16] and combines them, and whose
HACK switch gives an invariant kernel and ones whose rows depend on the batch (the partial
sums' count chosen from B, another path for B == 1, a row's place, a call counter), plus
kernels that break a rule only in a batch of one the judge makes itself.

- the spec: the key's forms and its mistakes, each at its file, line and key;
- the plan of sub-batches: drawn from the trial's seed, served, the rows it promises;
- the judge in this process with a kernel in Python (quick), then in a worker with the CPU
  kernels (slow): recorded invariant or not with the reason, wrong under `require`;
- pipe compare's table and pipe export's package record the flag; the exported op's
  deterministic lookup, on hand-made tables.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from runner import cli
from runner.build.builder import Builder
from runner.core.records import Trial
from runner.judge import invariance
from runner.ship.exported_runtime import Op
from runner.spec.spec import load_spec

from .conftest import JudgeBench, explain, module_bench

DATA = Path(__file__).resolve().parent / "data"
TEMPLATE = DATA / "batch_inv.cpp.j2"
RAGGED_DIR = Path(__file__).resolve().parent / "ragged_cpu"
HACKS = ["honest", "split_by_b", "b_eq_1", "position", "counter", "junk_alone", "wrong_alone", "past_end_alone"]
REFERENCE = '''import torch


def ragged_sum(x, lens):
    keep = torch.arange(x.shape[1], device=x.device) < lens.to(torch.int64)[:, None]
    return torch.where(keep[..., None] if x.dim() == 3 else keep, x,
                       torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=1)
'''


def spec_data(batch="B", domain: bool = False) -> dict:
    """The test spec: one timed shape (B 6), a batch of one verified at L 17 only, and B 3;
    a row of the output is 8 column sums."""
    op = {"reference": "set by write()", "dtype": "fp32",
          "inputs": {"x": {"shape": ["B", "L", 8], "dist": ["normal", "positive"]},
                     # long sequences: two summation orders differ in the last bits of most sums
                     "lens": {"shape": ["B"], "dtype": "int32", "dist": "randint", "low": "L // 2",
                              "high": "L + 1"}},
          "outputs": {"out": {"shape": ["B", 8]}},
          "shapes": [{"B": 6, "L": 300}], "extra_shapes": [{"B": 1, "L": 17}, {"B": 3, "L": 100}],
          "tolerance": {"atol": 1.0e-3, "rtol": 1.0e-4}, "bytes": "elem * B * L * 8 + 4 * B + elem * B * 8"}
    if batch is not None:
        op["batch_invariant"] = batch
    kernel = {"template": "batch_inv.cpp.j2", "entry": "bsum", "args": ["x", "lens", "out", "ws", "B", "L"],
              "scratch": {"ws": {"shape": ["B", 16], "dtype": "fp32"}}}
    d = {"name": "batch-inv-cpu", "description": "ragged row sums with a HACK switch (tests/test_batch_invariant.py)",
         "hardware": "host-cpu", "op": op, "kernel": kernel,
         "runtime": {"cache": "warm", "warmup_ms": 2, "rep_ms": 5, "checks": 2, "timeout_s": 30, "threads": 1},
         "baseline": "none", "search": {"params": {"HACK": list(HACKS)}}, "forbidden": ["fast_math"],
         "agent": {"strategy": "grid"}, "goal": {"budget": {"trials": 10}}}
    if domain:  # B from 2: no batch of one is in the domain
        op["domain"] = {"B": {"min": 2, "max": 8}, "L": {"min": 16, "max": 512}}
        op["grid"] = {"per_octave": 0.5}
        op["extra_shapes"] = [{"B": 2, "L": 17}, {"B": 3, "L": 100}]
        d["baseline"] = "reference"
        kernel["serves"] = "L >= 17"
    return d


def reference_in(folder: Path) -> str:
    """The reference written into `folder` as a module named for that folder (a spec's folder
    stays on sys.path, and two folders may not offer one module name): "module:function"."""
    mod = "binv_ref_" + hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{mod}.py").write_text(REFERENCE)
    return f"{mod}:ragged_sum"


def write(folder: Path, data: dict, name: str = "spec.yaml") -> Path:
    data = copy.deepcopy(data)
    data["op"]["reference"] = reference_in(folder)
    shutil.copyfile(TEMPLATE, folder / "batch_inv.cpp.j2")
    p = folder / name
    p.write_text(yaml.safe_dump(data, sort_keys=False, width=1000))
    return p


# -- the spec ---------------------------------------------------------------------------------------

def test_both_forms_of_the_key(tmp_path):
    s = load_spec(write(tmp_path, spec_data()))
    assert (s.op.batch_axis, s.op.batch_required) == ("B", False)
    s = load_spec(write(tmp_path, spec_data({"axis": "B", "require": True})))
    assert (s.op.batch_axis, s.op.batch_required) == ("B", True)
    s = load_spec(write(tmp_path, spec_data(None)))
    assert s.op.batch_axis is None


def test_agents_are_told_about_the_batch_axis(tmp_path):
    from runner.loop import brief

    b = brief(load_spec(write(tmp_path, spec_data({"axis": "B", "require": True}))))
    assert b["batch_invariant"]["axis"] == "B" and b["batch_invariant"]["required"] is True
    assert "a kernel that is not is wrong" in b["batch_invariant"]["rule"]
    assert "batch_invariant" not in brief(load_spec(write(tmp_path, spec_data(None))))


def test_the_decode_attention_pipeline_names_its_batch_axis():
    from .conftest import PIPELINES, shipped_spec

    s = shipped_spec(PIPELINES / "decode-attention-h200.yaml")
    assert (s.op.batch_axis, s.op.batch_required) == ("B", False)


def _errors(capsys, path: Path) -> list[tuple[int, int, str, str]]:
    import re

    rc = cli.main(["validate", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    out = [(int(m[1]), int(m[2]), m[3], m[4]) for m in re.finditer(r"^\S*\.(?:yaml|j2):(\d+):(\d+): (\S+): (.*)$",
                                                                      err, re.M)]
    assert out, err
    return out


def _line(path: Path, needle: str, after: str | None = None) -> int:
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if after in ln) if after else 0
    return next(i for i, ln in enumerate(lines) if i >= start and needle in ln) + 1


def _change(d: dict, what: str) -> None:
    op = d["op"]
    if what == "unknown":
        op["batch_invariant"] = "Q"
    elif what == "unknown_axis":
        op["batch_invariant"] = {"axis": "Q", "require": True}
    elif what == "not_leading":
        op["inputs"]["x"]["shape"] = ["L", "B", 8]
    elif what == "twice":
        op["inputs"]["x"]["shape"] = ["B", "B * L", 8]
    elif what == "expression":
        op["outputs"]["out"]["shape"] = ["B * 1", 8]
    elif what == "no_output_axis":
        op["outputs"]["out"]["shape"] = [8]
    elif what == "values":
        op["inputs"]["lens"]["high"] = "B + L"
    elif what == "timed_values":
        op["inputs"]["lens"]["timed"] = {"low": "B"}
    elif what == "in_place":
        op["in_place"] = True
    elif what == "small":
        op["shapes"] = [{"B": 2, "L": 300}]
        op["extra_shapes"] = [{"B": 1, "L": 17}]
    elif what == "misspelt":
        op["batch_invariant"] = {"axis": "B", "requires": True}


CASES = [  # (change, key path, message, the line's needle, after)
    ("unknown", "op.batch_invariant", "'Q' is no shape symbol (they are B, L)", "batch_invariant:", None),
    ("unknown_axis", "op.batch_invariant.axis", "'Q' is no shape symbol", "axis: Q", None),
    ("not_leading", "op.inputs.x.shape[1]", "must be the leading dimension", "- B", "x:"),
    ("twice", "op.inputs.x.shape[1]", "x's shape[1] is 'B * L'", "- B * L", "x:"),
    ("expression", "op.outputs.out.shape[0]", "out's shape[0] is 'B * 1'", "- B * 1", "out:"),
    ("no_output_axis", "op.outputs.out", "output 'out' has no batch axis 'B'", "out:", "outputs:"),
    ("values", "op.inputs.lens.high", "the values of 'lens' may not depend on the batch size", "high: B + L",
     None),
    ("timed_values", "op.inputs.lens.timed.low", "may not depend on the batch size", "low: B", "timed:"),
    ("in_place", "op.batch_invariant", "cannot check an in-place op", "batch_invariant:", None),
    ("small", "op.batch_invariant", "needs a verified shape (op.shapes or op.extra_shapes) with B >= 3",
     "batch_invariant:", None),
    ("misspelt", "op.batch_invariant.requires", "did you mean 'require'", "requires:", None),
]


@pytest.mark.parametrize("change,key,message,needle,after", CASES, ids=[c[0] for c in CASES])
def test_spec_mistakes_are_errors_at_their_line_and_key(tmp_path, capsys, change, key, message, needle, after):
    d = spec_data()
    _change(d, change)
    p = write(tmp_path, d)
    hits = [e for e in _errors(capsys, p) if e[2] == key and message in e[3]]
    assert hits, _errors(capsys, p)
    assert hits[0][0] == _line(p, needle, after), (hits, p.read_text())
    assert hits[0][1] >= 1


def test_a_template_that_reads_the_batch_size_is_refused(tmp_path, capsys):
    """Sizes compiled in (no op.domain): the batch size may still reach the kernel as an argument
    only, since the judge calls the same binary on sub-batches of other sizes."""
    d = spec_data()
    p = write(tmp_path, d)
    t = tmp_path / "batch_inv.cpp.j2"
    t.write_text(t.read_text().replace("static int64_t calls = 0;", "static int64_t calls = {{ B }};"))
    rc = cli.main(["validate", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    line = next(i for i, ln in enumerate(t.read_text().splitlines(), 1) if "{{ B }}" in ln)
    # the message is at the template's line, its file named
    assert f"{t}:{line}:1: the template reads 'B', but op.batch_invariant of {p} names 'B' the batch axis" in err, err


# -- the plan -----------------------------------------------------------------------------------

def test_the_plan_follows_the_seed_and_builds_its_compositions_from_the_batch():
    shapes = [{"B": 6, "L": 300}, {"B": 1, "L": 17}, {"B": 3, "L": 100}, {"B": 40, "L": 8}]
    seen_rows, seen_shapes = set(), set()
    for seed in range(60):
        p = invariance.plan("B", shapes, seed)
        assert p == invariance.plan("B", shapes, seed)  # the seed decides everything
        assert len(p) == invariance.SHAPES and all(shapes[c["index"]]["B"] >= 3 for c in p)
        for c in p:
            shape, b = shapes[c["index"]], shapes[c["index"]]["B"]
            seen_shapes.add(c["index"])
            seen_rows.add((c["index"], c["row"]))
            kinds = {s["kind"]: s for s in c["subs"]}
            assert set(kinds) == {"alone", "reordered", "mixed"}
            assert kinds["alone"] == {"kind": "alone", "shape": {**shape, "B": 1}, "rows": [c["row"]]}
            perm = kinds["reordered"]["rows"]
            assert kinds["reordered"]["shape"] == shape and sorted(perm) == list(range(b))
            assert all(p_ != r for p_, r in enumerate(perm))  # every row moves
            mixed = kinds["mixed"]
            k = mixed["shape"]["B"]
            assert 2 <= k < b and len(mixed["rows"]) == k and c["row"] in mixed["rows"]
            own = [r for r in mixed["rows"] if r is not None]
            assert None in mixed["rows"] and len(set(own)) == len(own)  # fresh rows, no row twice
    assert seen_shapes == {0, 2, 3}  # every shape with a batch of 3 or more, none of one
    assert len({r for s, r in seen_rows if s == 3}) > 15  # the row is drawn


def test_the_plan_leaves_out_what_the_configuration_does_not_serve():
    p = invariance.plan("B", [{"B": 3, "L": 100}], 7, serves=lambda sh: sh["B"] >= 2)
    assert [s["kind"] for s in p[0]["subs"]] == ["reordered", "mixed"]
    assert p[0]["skipped"] == ["alone: the configuration does not serve B=1"]
    p = invariance.plan("B", [{"B": 3, "L": 100}], 7, serves=lambda sh: sh["B"] == 3)
    assert [s["kind"] for s in p[0]["subs"]] == ["reordered"] and len(p[0]["skipped"]) == 2
    assert invariance.plan("B", [{"B": 2, "L": 100}], 7) == []


def test_sub_batch_inputs_and_bitwise_rows(tmp_path):
    spec = load_spec(write(tmp_path, spec_data()))
    g = torch.Generator().manual_seed(0)
    inputs = {"x": torch.randn(4, 5, generator=g), "lens": torch.tensor([1, 2, 3, 4], dtype=torch.int32)}
    fresh = {"x": torch.full((3, 5), 9.0), "lens": torch.tensor([7, 7, 7], dtype=torch.int32)}
    xs = invariance.sub_inputs(spec.op, "B", inputs, [2, None, 0], fresh)
    assert torch.equal(xs["x"][0], inputs["x"][2]) and torch.equal(xs["x"][1], fresh["x"][1])
    assert torch.equal(xs["x"][2], inputs["x"][0]) and xs["lens"].tolist() == [3, 7, 1]
    assert xs["x"].data_ptr() not in (inputs["x"].data_ptr(), fresh["x"].data_ptr())
    full = torch.tensor([1.0, float("nan"), 0.0, 4.0])
    sub = torch.tensor([4.0, -0.0, float("nan")])
    # -0.0 is not 0.0; a NaN equals itself only with the same payload
    assert invariance.differing_rows(full, sub, [3, 2, 1]) == [(1, 2)]
    other_nan = torch.tensor([4.0, 0.0, 0.0]).view(torch.int32)
    other_nan[2] = 0x7FC00001
    assert invariance.differing_rows(full, other_nan.view(torch.float32), [3, 2, 1]) == [(2, 1)]
    assert "1 of 1 elements differ" in invariance.first_difference(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_the_evaluator_works_out_each_sub_batch_launch_for_its_shape(tmp_path):
    """With op.domain: the sub-batches served and inside the domain (B from 2 here: no batch
    of one), each with its own scratch shape (ws [B, 2] at its own B)."""
    from runner.judge.evaluator import Evaluator

    s = load_spec(write(tmp_path, spec_data(domain=True)))
    ev = Evaluator(s, worker=None, baseline=None)
    trial = Trial(params={"HACK": "honest"}, status="ok", agent="t", spec_hash=s.hash, started_at=0.0)
    shapes = [{"B": 6, "L": 300}, {"B": 3, "L": 100}, {"B": 2, "L": 17}]
    job = {"shapes": shapes}
    assert ev._invariance(trial, {"HACK": "honest"}, job) is None
    assert isinstance(trial.details["batch_seed"], int)
    bare = [{**c, "subs": [{k: v for k, v in sub.items() if k != "geometry"} for sub in c["subs"]]}
            for c in job["invariance"]]
    assert bare == invariance.plan(
        "B", shapes, trial.details["batch_seed"],
        lambda sh: s.op.in_domain(sh) is None and s.kernel.serves_shape({"HACK": "honest"}, sh, 4))
    for c in job["invariance"]:
        assert c["skipped"][0].startswith("alone")
        for sub in c["subs"]:
            assert sub["shape"]["B"] >= 2
            assert sub["geometry"]["scratch"] == {"ws": [sub["shape"]["B"], 16]}


# -- the judge in this process, with a kernel in Python ---------------------------------------------

class InProcess:
    """The Judge in this process with a Python kernel (row sums through torch): the check's own
    logic without native code. `behaviour(x, B, calls)` returns the row sums (`behaviour(x, B, calls,
    out)`: and sees what the output held before the call)."""

    def __init__(self, spec, behaviour):
        from runner.judge.worker import Judge

        self.threads = torch.get_num_threads()
        self.judge = j = Judge(spec)
        j.census = None
        self.calls = 0
        self.batches: list[tuple[int, int]] = []  # (B, L) of every call

        def kernel(x, lens, out, ws, B, L):
            self.calls += 1
            self.batches.append((B, L))
            keep = torch.arange(L) < lens.to(torch.int64)[:, None]
            xm = torch.where(keep[..., None], x, torch.zeros(()))
            extra = (out.clone(),) if behaviour.__code__.co_argcount == 4 else ()
            out.copy_(behaviour(xm, B, self.calls, *extra))
            assert ws.shape == (B, 16) and not bool(ws.any())  # its own workspace, zero, for its batch

        j.rt.load = lambda artifact, entry, kinds: kernel

        def values(shape, inputs, outs, ws=(), geometry=None):
            named = {**inputs, **{t.name: o.view for t, o in zip(j.op.outputs, outs)}, **{w.name: w.view for w in ws}}
            return [named[a] if a in named else shape[a] for a in spec.kernel.args]

        j._values = values

    def evaluate(self, seed: int = 5, n_shapes: int = invariance.SHAPES) -> dict:
        j = self.judge
        shapes = list(j.op.all_shapes)
        plan = invariance.plan("B", shapes, seed, n_shapes=n_shapes)
        b = Builder(j.spec)
        for c in plan:
            for sub in c["subs"]:
                sub["geometry"] = b.geometry({"HACK": "honest"}, [sub["shape"]])[0]
        job = {"seed": seed, "artifacts": ["py"] * len(shapes), "geometry": b.geometry({"HACK": "honest"}),
               "invariance": plan}
        return j.evaluate(job)

    def close(self):
        torch.set_num_threads(self.threads)


def _sums(x):
    return x.sum(dim=1)


def _nudged(s):
    return torch.nextafter(s, torch.full_like(s, float("inf")))


@pytest.fixture
def in_process(tmp_path):
    made = []

    def make(behaviour, batch="B"):
        ip = InProcess(load_spec(write(tmp_path, spec_data(batch))), behaviour)
        made.append(ip)
        return ip

    yield make
    for ip in made:
        ip.close()


def test_in_process_an_invariant_kernel_is_recorded_invariant(in_process):
    ip = in_process(lambda x, B, n: _sums(x))
    r = ip.evaluate()
    assert r["status"] == "ok", r
    bi = r["batch_invariance"]
    assert bi["invariant"] is True and bi["reason"] is None and bi["run_to_run"] is True
    assert [c["shape"] for c in bi["checked"]] == [{"B": 6, "L": 300}, {"B": 3, "L": 100}]
    assert all(c["compositions"][0].endswith("alone (a batch of 1)") for c in bi["checked"])
    batches = {b for b, n in ip.batches if n == 300}
    assert {1, 6} <= batches and len(batches) == 3  # alone, reordered and mixed at 6x300


def test_in_process_a_kernel_that_takes_another_path_for_one_row_is_not_invariant(in_process):
    ip = in_process(lambda x, B, n: _nudged(_sums(x)) if B == 1 else _sums(x))
    r = ip.evaluate()
    assert r["status"] == "ok", r  # right: one ulp inside the budget
    bi = r["batch_invariance"]
    assert bi["invariant"] is False and bi["run_to_run"] is True
    assert "alone (a batch of 1): output 'out' at place 0 differs from row" in bi["reason"], bi["reason"]
    assert "8 of 8 elements differ" in bi["reason"] and "bits 0x" in bi["reason"]


def test_in_process_a_kernel_invariant_only_on_a_filled_output_is_not_invariant(in_process):
    # a batch of one (at L >= 100, which only the sub-batch calls meet) takes another path where
    # its output held zeros, as a user's fresh one does; the sub-batch calls always found a decoy
    # there, and the kernel was recorded invariant
    def zeros_alone(x, B, n, out):
        return _nudged(_sums(x)) if B == 1 and x.shape[1] >= 100 and not bool(out.any()) else _sums(x)

    flags = [in_process(zeros_alone).evaluate(seed=s)["batch_invariance"]["invariant"] for s in range(6)]
    assert False in flags, flags  # each shape's alone call finds zeros in half the evaluations


def test_in_process_required_invariance_makes_it_wrong(in_process):
    ip = in_process(lambda x, B, n: _nudged(_sums(x)) if B == 1 else _sums(x), {"axis": "B", "require": True})
    r = ip.evaluate()
    assert r["status"] == "wrong" and r["reason"].startswith(
        "not batch-invariant (op.batch_invariant requires it): shape 0 {'B': 6, 'L': 300}: row"), r


def test_in_process_run_to_run_differences_are_caught(in_process):
    ip = in_process(lambda x, B, n: _nudged(_sums(x)) if n % 2 else _sums(x))
    r = ip.evaluate(n_shapes=0)  # no sub-batch at all: the rounds' two calls see it
    bi = r["batch_invariance"]
    assert r["status"] == "ok" and bi["invariant"] is False and bi["run_to_run"] is False and bi["checked"] == []
    assert bi["reason"].startswith("shape 0 {'B': 6, 'L': 300}, check 0: output 'out' differs between two calls "
                                   "on the same inputs (run to run: 48 of 48 elements differ"), bi["reason"]


def test_in_process_a_row_wrong_only_alone_is_wrong(in_process):
    ip = in_process(lambda x, B, n: _sums(x) * (2 if B == 1 else 1))
    r = ip.evaluate()
    assert r["status"] == "wrong", r
    assert "batch invariance: row" in r["reason"] and "alone (a batch of 1): output 'out' at place 0 (row" in \
        r["reason"] and "outside atol" in r["reason"] and "(the same row is right in the full batch)" in r["reason"]


def test_in_process_without_the_key_nothing_is_checked(in_process):
    ip = in_process(lambda x, B, n: _nudged(_sums(x)) if B == 1 else _sums(x), None)
    r = ip.evaluate()
    assert r["status"] == "ok" and "batch_invariance" not in r
    assert (1, 300) not in ip.batches and (1, 100) not in ip.batches


def _chunked(monkeypatch, ip, rows: int) -> list:
    """The judge's reference given at most `rows` rows of x's float64 copy at a time; the batch
    sizes it was called with."""
    from runner.judge import worker

    monkeypatch.setattr(worker, "REF_CHUNK_BYTES", rows * (300 * 8 + 1) * 8)  # a row of x and of lens, as float64
    seen, ref = [], ip.judge.reference

    def spy(x, lens, **kw):
        seen.append((int(x.shape[0]), x.dtype, int(lens.shape[0])))
        return ref(x, lens, **kw)

    spy.__name__ = ref.__name__
    ip.judge.reference = spy
    return seen


def test_the_reference_goes_a_few_rows_at_a_time_where_its_copies_would_be_large(in_process, monkeypatch):
    ip = in_process(lambda x, B, n: _sums(x))
    inputs = ip.judge._inputs({"B": 6, "L": 300}, 11, 0)
    whole = ip.judge._call_reference(inputs)
    seen = _chunked(monkeypatch, ip, 4)
    parts = ip.judge._call_reference(inputs)
    assert seen == [(4, torch.float64, 4), (2, torch.float64, 2)]
    assert len(parts) == 1 and torch.equal(parts[0], whole[0]) and parts[0].shape == (6, 8)
    assert inputs["x"].dtype == torch.float32  # the candidate's values untouched
    r = ip.evaluate()
    assert r["status"] == "ok", r
    assert (4, torch.float64, 4) in seen and all(b <= 4 for b, _, _ in seen)


def test_inputs_a_reference_widens_itself_reach_it_as_private_copies_in_their_own_dtype(in_process):
    """A reference's `widens` names inputs it makes float64 itself (the paged decode caches):
    the judge clones those in their own dtype, and still hands the others over as float64."""
    ip = in_process(lambda x, B, n: _sums(x))
    inputs = ip.judge._inputs({"B": 6, "L": 300}, 11, 0)
    whole = ip.judge._call_reference(inputs)
    seen, ref = [], ip.judge.reference

    def spy(x, lens, **kw):
        seen.append((x.dtype, x.data_ptr() == inputs["x"].data_ptr(), torch.equal(x, inputs["x"])))
        got = ref(x.to(torch.float64), lens, **kw)
        x.fill_(0)  # the copy is the reference's to spoil
        return got

    ip.judge.reference = spy
    spy.widens = ("x",)
    got = ip.judge._call_reference(inputs)
    assert seen == [(torch.float32, False, True)]
    assert torch.equal(got[0], whole[0]) and inputs["x"].abs().sum() > 0
    del spy.widens
    ip.judge._call_reference(inputs)
    assert seen[1][0] == torch.float64


@pytest.mark.parametrize("rows", [None, 4])  # the whole call, and a few rows at a time
def test_a_reference_that_widens_nothing_it_names_stops_the_run(in_process, monkeypatch, rows):
    """`widens` hands inputs over in their own dtype for the reference to widen: one that
    computes in that dtype instead would make a float32 verdict. The judge refuses its answer
    (check_reference: before the run's first trial)."""
    ip = in_process(lambda x, B, n: _sums(x))
    if rows:
        _chunked(monkeypatch, ip, rows)
    ref = ip.judge.reference

    def lazy(x, lens, **kw):
        return ref(x, lens, **kw)  # float32 x in, float32 sums out

    lazy.widens = ("x",)
    ip.judge.reference = lazy
    r = ip.judge.check_reference()
    assert r["status"] == "error" and "must widen them itself and return float64 outputs" in r["reason"], r
    lazy.widens = ()
    assert ip.judge.check_reference()["status"] == "ok"


def test_a_row_wrong_in_the_reference_s_last_chunk_is_still_wrong(in_process, monkeypatch):
    ip = in_process(lambda x, B, n: torch.cat([_sums(x)[:-1], _sums(x)[-1:] * 2]) if B == 6 else _sums(x))
    seen = _chunked(monkeypatch, ip, 4)
    r = ip.evaluate()
    assert r["status"] == "wrong" and "output 'out'" in r["reason"], r
    assert (2, torch.float64, 2) in seen, r["reason"]


# -- the judge in a worker, with the CPU kernels ----------------------------------------------------

class Bench(JudgeBench):
    def __init__(self, root: Path, batch="B"):
        write(root, spec_data(batch))
        text = (root / "spec.yaml").read_text()
        super().__init__(root, "batch_inv.cpp.j2", TEMPLATE.read_text(), "spec.yaml", text)


bench = module_bench("batch-inv", Bench)
required = module_bench("batch-inv-required", lambda root: Bench(root, {"axis": "B", "require": True}))


@pytest.mark.slow
def test_an_invariant_kernel_is_recorded_invariant(bench):
    t = bench.run("honest")
    assert t.status == "ok", explain(t)
    assert t.details["batch_invariant"] is True, t.details.get("batch_invariance")
    bi = t.details["batch_invariance"]
    assert bi["reason"] is None and bi["run_to_run"] is True and len(bi["checked"]) == 2
    assert isinstance(t.details["batch_seed"], int)


@pytest.mark.slow
@pytest.mark.parametrize("hack,where", [
    ("split_by_b", "shape "),  # B 6 or 3 sums in one chain, 1 in two, 2 or 5 in three (long rows)
    ("b_eq_1", "shape 0 {'B': 6, 'L': 300}: row"),  # only a batch of one, and it is the first composition
    ("position", "shape "),  # B 3: every derangement moves some row to another parity
])
def test_a_kernel_whose_rows_depend_on_the_batch_is_recorded_not_invariant(bench, hack, where):
    t = bench.run(hack)
    assert t.status == "ok", explain(t)  # right all the same
    assert t.details["batch_invariant"] is False
    why = t.details["batch_invariance"]["reason"]
    assert where in why and "differs from row" in why, why


@pytest.mark.slow
def test_a_kernel_that_alternates_its_order_call_by_call_is_caught_run_to_run(bench):
    t = bench.run("counter")
    assert t.status == "ok", explain(t)
    bi = t.details["batch_invariance"]
    assert t.details["batch_invariant"] is False and bi["run_to_run"] is False
    assert "differs between two calls on the same inputs" in bi["reason"], bi["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("hack,message", [
    ("junk_alone", "scratch 'ws' is not zero after the call"),
    ("wrong_alone", "outside atol"),
    ("past_end_alone", "output 'out': wrote outside its bounds"),
])
def test_rules_hold_in_the_judges_own_sub_batches(bench, hack, message):
    """Verification never sees a batch of one at L >= 100; the judge's sub-batch does, with its
    own outputs, guard bands and zeroed workspace."""
    t = bench.run(hack)
    assert t.status == "wrong", explain(t)
    assert "batch invariance: row" in t.reason and "alone (a batch of 1)" in t.reason and message in t.reason, \
        t.reason


@pytest.mark.slow
def test_required_invariance_judges_a_non_invariant_kernel_wrong(required):
    h = required.run("honest")
    assert h.status == "ok" and h.details["batch_invariant"] is True, explain(h)
    for hack in ("b_eq_1", "counter"):
        t = required.run(hack)
        assert t.status == "wrong", explain(t)
        assert t.reason.startswith("not batch-invariant (op.batch_invariant requires it): "), t.reason


@pytest.mark.slow
def test_the_same_kernels_carry_the_flag(bench):
    """A configuration judged as the same binaries as an earlier trial takes its flag too."""
    first = bench.run("honest")
    assert first.status == "ok"
    first.id = 1
    again = bench.ev.run({"HACK": "honest"}, "test")
    assert again.details.get("same_kernels_as") == 1 and again.details["batch_invariant"] is True


# -- pipe compare and pipe export --------------------------------------------------------------------

def _trial(tid: int, flag, params=None) -> Trial:
    t = Trial(params=params or {"T": tid}, status="ok", agent="t", spec_hash="h", started_at=0.0)
    t.id = tid
    if flag != "absent":
        t.details["batch_invariant"] = flag
    return t


def test_the_range_table_and_the_package_record_each_kernel_flag(tmp_path):
    from runner.ship.export import range_section
    from runner.ship.ranges import format_ranges

    data = copy.deepcopy(yaml.safe_load((RAGGED_DIR / "spec.yaml").read_text()))
    data["op"]["batch_invariant"] = "B"
    folder = tmp_path / "r"
    folder.mkdir()
    shutil.copyfile(RAGGED_DIR / "ragged.cpp.j2", folder / "ragged.cpp.j2")
    data["op"]["reference"] = reference_in(folder)
    (folder / "r.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    s = load_spec(folder / "r.yaml")
    history = [_trial(1, True), _trial(2, False), _trial(3, None)]
    rt = {"axes": ["B", "L"], "batch_axis": "B",
          "ranges": [{"lo": {"B": 1, "L": 16}, "hi": {"B": 33, "L": 4097}, "use": [2, 1, 3]}], "exact": [],
          "kernels": {str(t.id): {"params": t.params, "variant": None,
                                  "batch_invariant": t.details["batch_invariant"]} for t in history}}
    sec = range_section(s, rt, history, lambda tid, t: f"k{tid}.cubin")
    assert {k: v["batch_invariant"] for k, v in sec["kernels"].items()} == {"1": True, "2": False, "3": None}
    text = format_ranges(rt)
    assert "batch-invariant (B; the exported op's deterministic mode uses only these): #1; not: #2; " \
           "unchecked: #3" in text, text
    # a spec without the key: no flag anywhere
    plain = load_spec(RAGGED_DIR / "spec.yaml")
    assert "batch_invariant" not in range_section(plain, rt, history, lambda tid, t: "k")["kernels"]["1"]


def test_the_dispatch_table_of_sizes_compiled_in_records_the_flag(tmp_path):
    from runner.ship.export import dispatch_table

    s = load_spec(write(tmp_path, spec_data()))
    history = [_trial(1, True, {"HACK": "honest"}), _trial(2, False, {"HACK": "b_eq_1"})]
    history[0].times, history[1].times = [1e-6], [2e-6]
    rows = dispatch_table(s, history, None, [1.0])
    assert rows[0]["use"] == "kernel" and rows[0]["trial"] == 1 and rows[0]["batch_invariant"] is True


# -- the exported op's deterministic mode ------------------------------------------------------------

def _ranged(tmp_path: Path, batch=True) -> Op:
    """A table by range over B (1..64) and L (128..131072), B * L <= 2^21: small batches take
    kernel #2 (fastest there, not batch-invariant) then #1, larger ones #1; #3 (invariant)
    serves only B * L <= 2^16 (and, as every kernel, at most 128 splits of its SPLIT); the
    named shape 8x32768 lists #3 then #1."""
    table = {
        "op": "t.attn", "inputs": [{"name": "k", "dtype": "bf16", "shape": ["B", "L"]}],
        "outputs": [{"name": "o", "dtype": "bf16", "shape": ["B"]}], "scalars": [],
        "symbols": ["B", "L"], "baked": [], "entries": [], "entry": "k", "args": ["k", "o", "B", "L"],
        "derive": [["NS", "ceil_div(L, SPLIT)"]], "geometry": {"grid": ["B * NS"], "block": ["128"]},
        "batch_invariant": {"axis": "B", "required": False} if batch else None,
        "by_range": {
            "axes": ["B", "L"], "domain": {"B": [1, 64], "L": [128, 131072]}, "where": "B * L <= 2 ** 21",
            "elem": 2, "serves": "NS <= 128 and (SPLIT != 512 or B * L <= 2 ** 16)",
            "ranges": [{"lo": {"B": 1, "L": 128}, "hi": {"B": 4, "L": 8192}, "use": [2, 1]},
                       {"lo": {"B": 4, "L": 128}, "hi": {"B": 65, "L": 8192}, "use": [1]},
                       {"lo": {"B": 1, "L": 8192}, "hi": {"B": 4, "L": 131073}, "use": [3, 2, 1]},
                       {"lo": {"B": 4, "L": 8192}, "hi": {"B": 65, "L": 131073}, "use": [2, 1]}],
            "exact": [{"shape": {"B": 8, "L": 32768}, "use": [3, 1]}],
            "kernels": {"1": {"params": {"SPLIT": 1024}, "cubin": "k1.cubin", "batch_invariant": True},
                        "2": {"params": {"SPLIT": 256}, "cubin": "k2.cubin", "batch_invariant": False},
                        "3": {"params": {"SPLIT": 512}, "cubin": "k3.cubin", "batch_invariant": True}}}}
    return Op(tmp_path, table, reference=None)


def _pick(op: Op, b: int, n: int):
    return (op.entry_for({"B": b, "L": n}) or {}).get("trial")


def test_deterministic_lookup_takes_one_invariant_kernel_whatever_the_batch(tmp_path):
    op = _ranged(tmp_path)
    assert not op.deterministic
    assert [_pick(op, b, 1000) for b in (1, 3, 4, 64)] == [2, 2, 1, 1]  # by batch, the fastest
    op.set_deterministic(True)
    assert op.deterministic
    # looked up at B = 1, among the invariant kernels: #1 for every batch
    assert {_pick(op, b, 1000) for b in range(1, 65)} == {1}
    # L 8192 and over: #3 at B = 1; it serves B * L <= 2^16 only: past that the reference, never #1
    assert [_pick(op, b, 8192) for b in (1, 2, 8, 9, 64)] == [3, 3, 3, None, None]
    assert _pick(op, 8, 32768) is None  # the named shape's list is not looked at: B = 1's is
    assert _pick(op, 1, 32768) == 3 and _pick(op, 2, 32768) == 3 and _pick(op, 3, 32768) is None
    assert {_pick(op, b, 131072) for b in (1, 2, 16)} == {1}  # #3 serves no 131072 at B = 1: #1 for all
    # outside the domain (B * L > 2^21, B > 64) the reference, as without the mode
    assert _pick(op, 64, 65536) is None and _pick(op, 65, 1000) is None
    for n in (128, 300, 1000, 4096, 8191, 8192, 20000, 131072):  # the property itself
        picks = {_pick(op, b, n) for b in range(1, 65)} - {None}
        assert len(picks) <= 1, (n, picks)
    op.set_deterministic(False)
    assert _pick(op, 1, 1000) == 2  # the cache keeps the two modes apart


def test_deterministic_lookup_of_a_named_shape_at_the_smallest_batch(tmp_path):
    op = _ranged(tmp_path)
    op.by_range["exact"].append({"shape": {"B": 1, "L": 5000}, "use": [2, 3]})
    op.set_deterministic(True)
    assert {_pick(op, b, 5000) for b in (1, 2, 7, 13)} == {3}  # the B = 1 named shape's list, #2 skipped
    assert _pick(op, 14, 5000) is None  # 14 * 5000 > 2^16


def test_deterministic_lookup_of_kernels_with_their_sizes_compiled_in(tmp_path):
    """A table of tuned shapes (no op.domain): the nearest tuned shape in the free sizes is
    looked up as if B were 1, among the batch-invariant kernels (and the fallback's shapes)."""
    table = {"op": "t.r", "inputs": [{"name": "x", "dtype": "fp32", "shape": ["B", "N"]}],
             "outputs": [{"name": "y", "dtype": "fp32", "shape": ["B", "N"]}], "scalars": [],
             "symbols": ["B", "N"], "baked": ["N"], "entry": "k", "args": ["x", "y", "B", "N"],
             "derive": [], "geometry": {"grid": ["B"], "block": ["32"]},
             "batch_invariant": {"axis": "B", "required": False},
             "entries": [{"key": [1024], "shape": {"B": 4, "N": 1024}, "use": "kernel", "trial": 1,
                          "params": {}, "cubin": "a", "batch_invariant": False},
                         {"key": [1024], "shape": {"B": 64, "N": 1024}, "use": "kernel", "trial": 2,
                          "params": {}, "cubin": "b", "batch_invariant": True},
                         {"key": [4096], "shape": {"B": 2, "N": 4096}, "use": "fallback", "trial": None,
                          "params": None},
                         {"key": [4096], "shape": {"B": 64, "N": 4096}, "use": "kernel", "trial": 3,
                          "params": {}, "cubin": "c", "batch_invariant": True}]}
    op = Op(tmp_path, table, reference=None)
    pick = lambda b, n: (op.entry_for({"B": b, "N": n}) or {}).get("trial")  # noqa: E731
    assert [pick(b, 1024) for b in (1, 8, 64)] == [1, 1, 2] and pick(64, 4096) == 3
    op.set_deterministic(True)
    assert {pick(b, 1024) for b in (1, 8, 64, 1000)} == {2}  # #1 is not invariant
    assert {pick(b, 4096) for b in (1, 8, 64)} == {None}  # at B = 1 the nearest tuned shape falls back
    assert pick(1, 512) is None  # no tuned N: the reference


def test_deterministic_mode_needs_a_batch_axis_and_follows_the_environment(tmp_path, monkeypatch):
    op = _ranged(tmp_path, batch=False)
    with pytest.raises(ValueError, match="names no batch axis"):
        op.set_deterministic(True)
    op.set_deterministic(False)  # turning it off is always fine
    monkeypatch.setenv("PIPE_DETERMINISTIC", "1")
    on = _ranged(tmp_path)
    assert on.deterministic and _pick(on, 2, 1000) == 1
    off = _ranged(tmp_path, batch=False)  # no axis: the reference for everything
    assert off.deterministic and _pick(off, 2, 1000) is None
    monkeypatch.setenv("PIPE_DETERMINISTIC", "0")
    assert not _ranged(tmp_path).deterministic


def test_an_exported_package_offers_set_deterministic(tmp_path, monkeypatch):
    """The package's own module (export._INIT) with a hand-made table: set_deterministic and
    deterministic() reach the op; CPU tensors take the reference either way."""
    from runner.ship import export

    pkg = tmp_path / "pkgs" / "detpkg"
    pkg.mkdir(parents=True)
    op = _ranged(tmp_path)
    table = dict(op.t, namespace="pipe_detpkg_test", name="ragged_sum", op="pipe_detpkg_test.ragged_sum",
                 inputs=[{"name": "x", "dtype": "fp32", "shape": ["B", "L"]},
                         {"name": "lens", "dtype": "int32", "shape": ["B"]}],
                 outputs=[{"name": "out", "dtype": "fp32", "shape": ["B"]}])
    # the kernels the table names, as files with the digests an export records (never loaded here)
    names = sorted({k["cubin"] for k in table["by_range"]["kernels"].values()})
    for n in names:
        (pkg / n).write_bytes(b"\x7fELF " + n.encode())
    table["digests"] = {n: hashlib.sha256((pkg / n).read_bytes()).hexdigest() for n in names}
    (pkg / "table.json").write_text(json.dumps(table))
    shutil.copyfile(Path(export.__file__).with_name("exported_runtime.py"), pkg / "_runtime.py")
    (pkg / "_reference.py").write_text(REFERENCE)
    (pkg / "__init__.py").write_text(export._INIT.format(spec="t", name="ragged_sum", qual="pipe_detpkg_test::ragged_sum",
                                                         fn="ragged_sum", rule="r", qual_dot="pipe_detpkg_test.ragged_sum"))
    monkeypatch.syspath_prepend(str(pkg.parent))
    mod = importlib.import_module("detpkg")
    try:
        assert mod.deterministic() is False
        mod.set_deterministic(True)
        assert mod.deterministic() is True and mod.op.entry_for({"B": 5, "L": 1000})["trial"] == 1
        x, lens = torch.randn(3, 200), torch.tensor([200, 5, 1], dtype=torch.int32)
        out = mod.ragged_sum(x, lens)
        assert out.shape == (3,) and mod.op.calls == {"kernel": 0, "fallback": 1}
        mod.set_deterministic(False)
        assert mod.deterministic() is False
    finally:
        sys.modules.pop("detpkg", None)
        for k in [k for k in sys.modules if k.startswith("detpkg.")]:
            sys.modules.pop(k, None)


# -- end to end -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_and_compare_of_the_ragged_op_record_the_flag(tmp_path):
    """The ragged op of tests/ragged_cpu with its batch axis named: every trial of a run is
    checked (its kernel is invariant), and pipe compare's range table lists the flag."""
    from runner.ship.compare import compare_and_write, format_table

    data = copy.deepcopy(yaml.safe_load((RAGGED_DIR / "spec.yaml").read_text()))
    data["op"]["batch_invariant"] = "B"
    data["goal"] = {"budget": {"trials": 2}}
    folder = tmp_path / "r"
    folder.mkdir()
    shutil.copyfile(RAGGED_DIR / "ragged.cpp.j2", folder / "ragged.cpp.j2")
    data["op"]["reference"] = reference_in(folder)
    (folder / "r.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    run = tmp_path / "run"
    assert cli.main(["run", str(folder / "r.yaml"), "--run-dir", str(run), "-q"]) in (0, 1)
    from runner.ship.rundata import open_run

    trials = open_run(run, None, "test").history
    assert trials and all(t.status == "ok" for t in trials), [(t.status, t.reason) for t in trials]
    for t in trials:
        assert t.details["batch_invariant"] is True, t.details.get("batch_invariance")
        checked = t.details["batch_invariance"]["checked"]
        assert checked and all(c["shape"]["B"] >= 3 for c in checked)
    doc = compare_and_write(run, rounds=2, top=1, points=4, torch_compile=False)
    table = doc["range_table"]
    assert table["batch_axis"] == "B" and table["kernels"], (table.get("dropped"), table["ranges"])
    assert all(k["batch_invariant"] is True for k in table["kernels"].values())
    assert "batch-invariant (B; the exported op's deterministic mode uses only these): #" in format_table(doc)
