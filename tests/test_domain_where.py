"""op.domain_where (a constraint across the domain's symbols) and an input's `timed` override
(its values in timed calls), on the ragged test op of tests/ragged_cpu/ (B rows, each summed
to its own length lens[b] <= L, B * L <= 2^14) and on the RMSNorm range spec.

- the spec: mistakes in either key are errors at their file, line, column and key path;
- the tuning grid keeps every point where the constraint holds and drops the others, with
  `tune` sizes lowered to satisfy it;
- the judge's secret domain checks, pipe compare's curve points and its bisection midpoints
  satisfy it; the exported op takes the fallback outside it;
- timed calls (a candidate's timed loop, the baseline, the re-timing, pipe compare's arms)
  get the override's values, verification the input's own, in the same buffers.
"""

from __future__ import annotations

import copy
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from runner import cli
from runner.judge import domain, inputs
from runner.judge.inputs import make_inputs
from runner.ship import ranges
from runner.ship.exported_runtime import Op
from runner.spec.spec import grid_points, load_spec

from .conftest import PIPELINES

RAGGED_DIR = Path(__file__).resolve().parent / "ragged_cpu"
RAGGED = RAGGED_DIR / "spec.yaml"
RAGGED_BASE = yaml.safe_load(RAGGED.read_text())
RANGE_CPU = PIPELINES / "rmsnorm-range-cpu.yaml"
RANGE_BASE = yaml.safe_load(RANGE_CPU.read_text())
LIMIT = 2 ** 14  # the ragged spec's B * L bound


def ragged_spec(tmp_path: Path, change=None) -> Path:
    """The ragged spec, changed, in a folder of its own (with its template and a copy of its
    reference under another name: a spec folder stays on sys.path, and a worker this process
    spawns later for tests/ragged_cpu must not meet a second `ragged_ref` there)."""
    d = copy.deepcopy(RAGGED_BASE)
    d["op"]["reference"] = "ragged_ref_copy:ragged_sum"
    if change is not None:
        change(d)
    folder = tmp_path / "ragged"
    if not folder.exists():
        folder.mkdir()
        shutil.copyfile(RAGGED_DIR / "ragged.cpp.j2", folder / "ragged.cpp.j2")
        shutil.copyfile(RAGGED_DIR / "ragged_ref.py", folder / "ragged_ref_copy.py")
    p = folder / "r.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def range_spec(project: Path, change) -> Path:
    """The RMSNorm range spec (N an axis, M `tune` levels) with few rows named, changed."""
    d = copy.deepcopy(RANGE_BASE)
    d["op"]["shapes"] = [{"M": 4, "N": 1024}]
    d["op"]["extra_shapes"] = [{"M": 1, "N": 4096}, {"M": 3, "N": 1000}, {"M": 7, "N": 66}]
    change(d)
    p = project / "pipelines" / "r.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def diagnostics(path: Path, capsys) -> list[tuple[int, int, str, str]]:
    """`pipe validate`'s errors as (line, column, key path, message); it must fail cleanly."""
    rc = cli.main(["validate", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    out = []
    for m in re.finditer(r"^\S*r\.yaml:(\d+):(\d+): (\S+): (.*)$", err, re.M):
        out.append((int(m[1]), int(m[2]), m[3], m[4]))
    assert out, err
    return out


def line_of(path: Path, needle: str) -> int:
    """The first line (1-based) of a file holding `needle` ("A >> B": the first holding B
    after the first holding A)."""
    lines = path.read_text().splitlines()
    start = 0
    if " >> " in needle:
        anchor, needle = needle.split(" >> ")
        start = next(i for i, line in enumerate(lines) if anchor in line) + 1
    return next(i for i, line in enumerate(lines[start:], start + 1) if needle in line)


def the_error(path: Path, capsys, key: str, message: str, needle: str | None = None) -> None:
    """One of the errors is at `key`, says `message` and (with `needle`) points at its line."""
    diags = diagnostics(path, capsys)
    hits = [d for d in diags if d[2] == key and message in d[3]]
    assert hits, diags
    if needle is not None:
        assert hits[0][0] == line_of(path, needle), (hits, path.read_text())
    assert hits[0][1] >= 1


# -- 1. op.domain_where: the spec -------------------------------------------------------------

def test_the_ragged_spec_holds_both_keys():
    s = load_spec(RAGGED)
    assert s.op.domain_where.text == "B * L <= 2 ** 14"
    lens = next(t for t in s.op.inputs if t.name == "lens")
    assert lens.low.text == "1" and lens.timed.low.text == "L" and lens.timed.high.text == "L + 1"
    x = next(t for t in s.op.inputs if t.name == "x")
    assert x.timed is None and x.drawn(timed=True) is x
    assert s.op.in_domain({"B": 4, "L": 4096}) is None
    why = s.op.in_domain({"B": 5, "L": 4096})
    assert "op.domain_where 'B * L <= 2 ** 14' does not hold at B=5, L=4096" in why


@pytest.mark.parametrize("change, key, message, needle", [
    (lambda d: d["op"].update(domain_where="B * K <= 4"), "op.domain_where", "unknown name K", "domain_where:"),
    (lambda d: d["op"].update(domain_where="B * L <="), "op.domain_where", "syntax error", "domain_where:"),
    (lambda d: d["op"].update(domain_where="B // (L - 16) < 99"), "op.domain_where", "ZeroDivisionError",
     "domain_where:"),
    (lambda d: d["op"].update(shapes=[{"B": 32, "L": 1000}]), "op.shapes[0]",
     "outside op.domain: op.domain_where 'B * L <= 2 ** 14' does not hold at B=32, L=1000", "- B: 32"),
    (lambda d: d["op"]["extra_shapes"].append({"B": 17, "L": 1000}), "op.extra_shapes[2]",
     "does not hold at B=17, L=1000", "- B: 17"),
    (lambda d: d["op"].update(held_out_shapes=[{"B": 30, "L": 4000}]), "op.held_out_shapes[0]",
     "does not hold at B=30, L=4000", "- B: 30"),
    (lambda d: d["op"].update(domain_where="B * L > 2 ** 30"), "op.domain_where", "holds at no tuning point",
     "domain_where:"),
    (lambda d: d["op"].pop("domain"), "op.domain_where", "needs op.domain", "domain_where:"),
])
def test_domain_where_mistakes_are_spec_errors(tmp_path, capsys, change, key, message, needle):
    the_error(ragged_spec(tmp_path, change), capsys, key, message, needle)


# -- 1. the tuning grid ---------------------------------------------------------------------------

def test_the_grid_drops_the_points_outside_and_keeps_the_others():
    s = load_spec(RAGGED)
    op = s.op
    grid = list(op.shapes[op.named:])
    raw = grid_points(op.domain, op.symbols, 0.25, 4)  # the product grid, no constraint
    assert len(raw) == 9
    assert all(g["B"] * g["L"] <= LIMIT and op.in_domain(g) is None for g in grid)
    assert grid == [g for g in raw if g["B"] * g["L"] <= LIMIT]  # the others, in the grid's order
    assert {"B": 32, "L": 4096} not in grid and {"B": 6, "L": 4096} not in grid
    assert {"B": 32, "L": 256} in grid and {"B": 1, "L": 4096} in grid  # the constraint's staircase
    assert s.op.shapes[0] == {"B": 4, "L": 1000}


def test_tune_sizes_are_lowered_to_the_constraint_and_axis_points_past_it_dropped(project):
    s = load_spec(range_spec(project, lambda d: d["op"].update(domain_where="M * N <= 2 ** 16 and N <= 8192")))
    op = s.op
    grid = op.shapes[op.named:]
    assert all(g["M"] * g["N"] <= 2 ** 16 and g["N"] <= 8192 for g in grid)
    ns = sorted({g["N"] for g in grid})
    assert ns == [64, 128, 256, 512, 1000, 1024, 2048, 4096, 8192]  # 16384 dropped, not moved
    main = [g for g in grid if op.level_of(g) == 0]
    few = [g for g in grid if op.level_of(g) == 1]
    # the main level's rows (2^18 // N) lowered to the largest the constraint lets through
    assert all(g["M"] == 2 ** 16 // g["N"] for g in main)
    assert all(g["M"] == 4 for g in few)  # the few rows hold: every level kept (4x1024 is named)
    assert sorted([g["N"] for g in few] + [1024]) == ns
    assert op.point({"N": 300}) == {"M": 2 ** 16 // 300, "N": 300}
    assert op.point({"N": 300}, 1) == {"M": 4, "N": 300}


# -- 1. the judge's domain checks -------------------------------------------------------------

def test_domain_checks_drawn_over_many_seeds_all_satisfy_it_and_reach_its_edge():
    s = load_spec(RAGGED)
    serves = lambda sh: sh["L"] >= 32  # noqa: E731 (a configuration that serves L >= 32)
    seen = []
    for seed in range(300):
        ds = domain.draws(s.op, serves, seed)
        assert ds and len(ds) <= domain.DRAWS
        assert all(x["B"] * x["L"] <= LIMIT and serves(x) and s.op.in_domain(x) is None for x in ds), ds
        seen += ds
    # the bisection for the highest sizes served stops at the constraint, exactly
    on_edge = [x for x in seen if (x["B"] + 1) * x["L"] > LIMIT or x["B"] * (x["L"] + 1) > LIMIT]
    assert on_edge and any(x["B"] > 1 and x["L"] > 32 for x in on_edge)
    assert {x["L"] for x in seen} >= {32}  # the lowest served, by bisection too


def test_domain_checks_of_a_run_of_tune_levels_satisfy_it(project):
    s = load_spec(range_spec(project, lambda d: d["op"].update(domain_where="M * N <= 2 ** 12")))
    serves = lambda sh: s.kernel.serves_shape({"ACC": 8, "THREADS": 1, "UNROLL": 1}, sh, 4)  # noqa: E731
    for seed in range(100):
        for x in domain.draws(s.op, serves, seed):
            assert x["M"] * x["N"] <= 2 ** 12 and s.op.in_domain(x) is None


# -- 1. pipe compare: the curve's secret points, the bisection's midpoints ------------------------

def test_compare_curve_points_satisfy_it():
    s = load_spec(RAGGED)
    for seed in range(60):
        pts = ranges.secret_points(s, seed, 24)
        assert len(pts) >= 20
        for p in pts:
            assert p["B"] * p["L"] <= LIMIT and s.op.in_domain(p) is None
            assert p not in list(s.op.shapes)


def test_compare_curve_points_with_few_rows_satisfy_it(project):
    s = load_spec(range_spec(project, lambda d: d["op"].update(domain_where="M * N <= 2 ** 15")))
    for seed in range(30):
        for p in ranges.secret_points(s, seed, 24):
            assert p["M"] * p["N"] <= 2 ** 15 and s.op.in_domain(p) is None


class ChoosingProber:
    """Prober's interface without a worker: every kernel serves every size; kernel #1 is
    faster below `cut` on symbol `sym` (N = 700 unless told), #2 from there on; torch eager is
    slower than both. Every shape timed, and the kernels offered there, are kept."""

    fallbacks: dict = {}

    def __init__(self, sym: str = "N", cut: int = 700):
        self.sym, self.cut = sym, cut
        self.timed: list[dict] = []
        self.lists: list[list[int]] = []

    def serves(self, tid, shape):
        return True

    def time(self, shapes, kernels, others=False, mode_of=None):
        self.timed += shapes
        self.lists += kernels
        out = []
        for sh, ks in zip(shapes, kernels):
            t = {1: 1.0 if sh[self.sym] < self.cut else 3.0, 2: 2.0}
            d = {f"#{k}": {"rounds": [t[k]] * 2, "median": t[k], "error": None} for k in ks}
            d["torch eager"] = {"rounds": [9.0, 9.0], "median": 9.0, "error": None}
            out.append(d)
        return out


def test_compare_bisection_never_times_a_midpoint_outside_it(project):
    # even row lengths only (the grid's are powers of two and 1000): the log-midpoints of a
    # bisection between them are often odd, and must not be timed
    s = load_spec(range_spec(project, lambda d: d["op"].update(domain_where="N % 2 == 0")))
    op = s.op
    grid = [{"shape": g, "use": [1] if g["N"] < 700 else [2], "times_s": {}, "eager_s": 9.0}
            for g in op.shapes[op.named:] if op.level_of(g) == 0]
    prober = ChoosingProber()
    rs = ranges._ranges_1d(s, "N", grid, prober, ranges.REFINE, None)
    assert rs[0]["lo"]["N"] == 64 and rs[-1]["hi"]["N"] == 16385
    assert prober.timed, "a bisection was expected between the two kernels' points"
    assert all(sh["N"] % 2 == 0 and op.in_domain(sh) is None for sh in prober.timed)
    # and a midpoint outside the constraint stops the bisection where it is
    stop = ranges.Cut(512, 1000, lambda v: None, [1], [2], "N")
    assert ranges._bisect([stop], prober, 3, None) == [ranges._geo_mid(512, 1000)]
    # in lockstep with one that goes on, whose steps still move: each keeps to itself
    prober.timed.clear()
    go = ranges.Cut(64, 16384, lambda v: {**op.shapes[0], "N": v} if v % 2 == 0 else None, [1], [2], "N")
    alone = ranges._bisect([go], prober, 3, None)
    assert len(prober.timed) == 3  # three steps, one shape each
    # the steps' sizes are drawn in secret (the middle half of each stretch, log scale): each
    # one closes in on the choices' crossing, never past it
    lo, hi = 64, 16384
    for sh in prober.timed:
        assert lo < sh["N"] < hi and abs(math.log(sh["N"] / math.sqrt(lo * hi))) <= math.log(hi / lo) / 4 + 1e-9
        lo, hi = (sh["N"], hi) if sh["N"] < prober.cut else (lo, sh["N"])
    assert lo < prober.cut <= hi and alone[0] == ranges._geo_mid(lo, hi)
    both = ranges._bisect([stop, go], prober, 3, None)
    assert both[0] == ranges._geo_mid(512, 1000) and 64 < both[1] < 16384


# -- 1. the exported op -----------------------------------------------------------------------------

def _exported(tmp_path: Path) -> Op:
    table = {
        "op": "t.ragged", "inputs": [{"name": "x", "dtype": "fp32", "shape": ["B", "L"]}],
        "outputs": [{"name": "y", "dtype": "fp32", "shape": ["B"]}], "scalars": [],
        "symbols": ["B", "L"], "baked": [], "entries": [], "entry": "k", "args": ["x", "y", "B", "L"],
        "derive": [], "geometry": {"grid": ["B"], "block": ["32"]},
        "by_range": {
            "axes": ["B", "L"], "domain": {"B": [1, 64], "L": [128, 131072]},
            "where": "B * L <= 2 ** 21 and elem * B <= 256", "elem": 2, "serves": None,
            "ranges": [{"lo": {"B": 1, "L": 128}, "hi": {"B": 65, "L": 131073}, "use": [1]}],
            "exact": [{"shape": {"B": 64, "L": 32768}, "use": [1]}],
            "kernels": {"1": {"params": {"T": 1}, "cubin": "k1.cubin"}}}}
    return Op(tmp_path, table, reference=None)


def test_the_exported_lookup_falls_back_outside_it(tmp_path):
    op = _exported(tmp_path)
    pick = lambda b, n: (op.entry_for({"B": b, "L": n}) or {}).get("trial")  # noqa: E731
    assert pick(1, 131072) == 1 and pick(16, 131072) == 1 and pick(64, 32768) == 1  # on its edge
    assert pick(17, 131072) is None and pick(64, 32769) is None and pick(64, 131072) is None  # past it
    assert pick(64, 32768) == 1  # the cached choice stands
    op.by_range["elem"] = 8  # `elem` is the package's dtype size: 8 * 64 > 256
    op._chosen.clear()
    assert pick(64, 128) is None and pick(32, 128) == 1
    # a kernel with its sizes compiled in (pipe export --exact) takes the fallback outside it too
    op.entries = [{"key": [32768], "baked": ["L"], "shape": {"B": 8, "L": 32768}, "use": "kernel", "trial": 9,
                   "params": {}, "cubin": "e9.cubin"}]
    op._chosen.clear()
    assert pick(8, 32768) == 9 and pick(64, 32768) is None  # 8 * 64 > 256
    assert op.where({"B": 1, "L": 0}) is True and op.where({"B": "x", "L": 1}) is False  # no crash


def test_export_writes_the_expression_and_its_rule():
    from runner.ship.export import range_rule, range_section

    s = load_spec(RAGGED)
    sec = range_section(s, {"axes": ["B", "L"], "ranges": [], "exact": []}, [], lambda tid, t: None)
    assert sec["where"] == "B * L <= 2 ** 14" and sec["elem"] == 4
    assert sec["domain"] == {"B": [1, 32], "L": [16, 4096]}
    assert "where B * L <= 2 ** 14" in range_rule(s)
    plain = load_spec(RANGE_CPU)
    assert range_section(plain, {"axes": ["N"], "ranges": [], "exact": []}, [], lambda tid, t: None)["where"] is None


# -- 2. the `timed` override: the spec -------------------------------------------------------------

def _lens(d: dict) -> dict:
    return d["op"]["inputs"]["lens"]


@pytest.mark.parametrize("change, key, message, needle", [
    (lambda d: _lens(d).update(timed={"lo": "L"}), "op.inputs.lens.timed.lo", "unknown key 'lo'; did you mean 'low'?",
     "lo: L"),
    (lambda d: _lens(d).update(timed={"low": "K"}), "op.inputs.lens.timed.low", "unknown name K", "low: K"),
    (lambda d: _lens(d).update(timed={"high": "L + N"}), "op.inputs.lens.timed.high", "unknown name N", "high: L + N"),
    (lambda d: _lens(d).update(timed={}), "op.inputs.lens.timed", "should be non-empty", "timed: {}"),
    (lambda d: _lens(d).update(timed={"dist": "normal"}), "op.inputs.lens.timed.dist",
     "integer tensors (int32) take dist 'randint'", "dist: normal"),
    (lambda d: _lens(d).update(timed={"low": "L + 1"}), "op.inputs.lens.timed",
     "low 1001 is not below high 1001 at B=4, L=1000", "low: L + 1"),
    # an override that does not make sense on a float input: bounds of a dist it is not drawn from
    (lambda d: d["op"]["inputs"]["x"].update(timed={"low": 1}), "op.inputs.x.timed.low",
     "'low' bounds dist 'randint' only; input 'x' (fp32) is drawn from normal, positive", "low: 1"),
    (lambda d: d["op"]["inputs"]["x"].update(timed={"dist": "randint"}), "op.inputs.x.timed",
     "dist 'randint' needs low and high", "dist: randint"),
    (lambda d: (_lens(d).pop("timed"), d["op"]["outputs"]["out"].update(timed={"dist": "normal"})),
     "op.outputs.out.timed", "an output has none", "timed:"),
    (lambda d: _lens(d).update(timed="L"), "op.inputs.lens.timed", "expected object", "timed: L"),
    (lambda d: _lens(d).update(high=1), "op.inputs.lens", "low 1 is not below high 1 at B=4, L=1000", "lens: >> shape:"),
])
def test_timed_override_mistakes_are_spec_errors(tmp_path, capsys, change, key, message, needle):
    the_error(ragged_spec(tmp_path, change), capsys, key, message, needle)


def test_a_float_input_may_take_another_distribution_when_timed(tmp_path):
    s = load_spec(ragged_spec(tmp_path, lambda d: d["op"]["inputs"]["x"].update(timed={"dist": ["uniform"]})))
    x = next(t for t in s.op.inputs if t.name == "x")
    assert x.dists == ("normal", "positive") and x.drawn(timed=True).dists == ("uniform",)


def test_compare_reports_the_timed_values():
    from runner.ship.compare import compared_inputs

    assert compared_inputs(load_spec(RAGGED)) == {"x": ["normal", "positive"], "lens": ["randint [L, L + 1)"]}
    assert compared_inputs(load_spec(RANGE_CPU))["w"] == ["positive"]


# -- 2. the values drawn -------------------------------------------------------------------------------

def test_make_inputs_timed_takes_the_override_and_verification_the_inputs_own():
    op = load_spec(RAGGED).op
    shape = {"B": 32, "L": 500}
    for seed in range(5):
        for r in range(3):
            v = make_inputs(op, shape, seed, r, "cpu")
            t = make_inputs(op, shape, seed, r, "cpu", timed=True)
            assert v["lens"].dtype == t["lens"].dtype == torch.int32 and v["lens"].shape == t["lens"].shape
            assert int(v["lens"].min()) >= 1 and int(v["lens"].max()) <= 500
            assert int(v["lens"].min()) < 500  # ragged: 32 rows all at 500 is one chance in 500^32
            assert torch.equal(t["lens"], torch.full((32,), 500, dtype=torch.int32))
            # the same draws otherwise: only the override differs, and verification's witness
            # rows (judge/inputs._witnessed: a sixteenth of the rows from the other distributions)
            differ = int((v["x"] != t["x"]).any(dim=-1).sum())
            assert differ <= 32 // inputs.WITNESS_SHARE


class Spy:
    """The Judge in this process, with a kernel in Python (it sums each row to its length with
    torch) that records what every call saw: the phase (verification or a timed loop), lens,
    and the buffers' addresses."""

    def __init__(self, spec):
        from runner.judge.worker import Judge

        self.threads = torch.get_num_threads()
        self.judge = j = Judge(spec)
        j.census = None  # no native code runs: no thread census
        self.phase = "verify"
        self.calls: list[tuple[str, torch.Tensor, int, tuple]] = []  # kernel calls
        self.torch_calls: list[tuple[str, torch.Tensor, int]] = []  # the reference in the op's dtype
        ref = j.reference

        def kernel(x, lens, out, B, L):
            self.calls.append((self.phase, lens.clone(), L, (x.data_ptr(), lens.data_ptr(), x.dtype, x.shape)))
            out.copy_(ref(x=x, lens=lens))

        def reference(x, lens):
            if x.dtype == torch.float32:  # a torch arm (the float64 references are the judge's own)
                self.torch_calls.append((self.phase, lens.clone(), x.shape[1]))
            return ref(x=x, lens=lens)

        j.reference = reference
        j.rt.load = lambda artifact, entry, kinds: kernel

        def values(shape, inputs, outs, ws=(), geometry=None):  # the tensors themselves, for the Python kernel
            named = {**inputs, **{t.name: o.view for t, o in zip(j.op.outputs, outs)}}
            return [named[a] if a in named else shape[a] for a in spec.kernel.args]

        j._values = values
        timed = j._time_checked

        def time_checked(*a, **k):
            self.phase = "timed"
            try:
                return timed(*a, **k)
            finally:
                self.phase = "verify"

        j._time_checked = time_checked

    def close(self):
        torch.set_num_threads(self.threads)


@pytest.fixture
def spy():
    s = Spy(load_spec(RAGGED))
    yield s
    s.close()


def test_verification_is_ragged_and_timed_calls_full_in_the_same_buffers(spy):
    j = spy.judge
    shapes = [j.op.shapes[0], *j.op.extra_shapes]  # 4x1000 timed; 1x17 and 3x100 verified only
    job = {"seed": 11, "artifacts": ["py"] * 3, "geometry": [None] * 3, "shapes": shapes, "n_timed": 1, "checks": 2}
    r = j.evaluate(job)
    assert r["status"] == "ok", r
    verify = [c for c in spy.calls if c[0] == "verify"]
    timed = [c for c in spy.calls if c[0] == "timed"]
    # 3 shapes x (their rounds x 2 runs, and the call on the decoys' value set, _primed): 2 rounds,
    # one more where all are extreme or the largest shape has no everyday one (round_indices), and
    # one more, bare, for each shape verified only (bare_rounds); the timed loop
    from runner.judge.worker import largest_shape, round_indices

    big = largest_shape(j.op, shapes)
    rounds = [len(round_indices(j.op, 11, si, 2, si == big)) + (si >= 1) for si in range(3)]
    assert len(verify) == sum(2 * n + 1 for n in rounds) and len(timed) >= 10, rounds
    for _, lens, L, _ in verify:
        assert int(lens.min()) >= 1 and int(lens.max()) <= L
    assert any(int(lens.min()) < L for _, lens, L, _ in verify if L == 1000)  # ragged
    for _, lens, L, _ in timed:
        assert L == 1000 and bool((lens == L).all())  # every row at its full length
    # nothing but the values tells them apart: the timed calls run in the last check round's
    # buffers (addresses, dtypes and shapes)
    last_check = [c[3] for c in verify if c[2] == 1000][-1]
    assert all(c[3] == last_check for c in timed)


def test_the_baseline_retiming_and_compare_arms_are_timed_on_the_override(spy):
    j = spy.judge
    spy.phase = "baseline"
    r = j.baseline("reference")
    assert r["status"] == "ok" and len(r["shapes"]) == len(j.op.shapes)
    spy.phase = "retime"
    r = j.retime([{"artifacts": ["py"], "geometry": [None]}, {"torch": "reference"}], rounds=2, seed=5, only=[0])
    assert r["status"] == "ok", r
    spy.phase = "compare"
    job = {"seed": 3, "rounds": 2, "shapes": [j.op.shapes[0], {"B": 7, "L": 333}], "compile": False, "arms": {},
           "copy": False, "candidates": [[{"label": "#1", "artifact": "py", "geometry": None}]] * 2}
    r = j.compare(job)
    assert r["status"] == "ok" and all(s["#1"]["error"] is None and s["torch eager"]["error"] is None
                                        for s in r["shapes"]), r
    phases = {p for p, *_ in spy.calls} | {p for p, *_ in spy.torch_calls}
    assert phases == {"baseline", "retime", "compare"}
    assert len([c for c in spy.torch_calls if c[0] == "baseline"]) >= 10 * len(j.op.shapes)
    for _, lens, L, *_ in spy.calls + spy.torch_calls:
        assert bool((lens == L).all()), (lens, L)


# -- both, end to end: a run, pipe compare ----------------------------------------------------------

@pytest.mark.slow
def test_a_run_and_compare_of_the_ragged_op(tmp_path):
    from runner.ship.compare import compare_and_write
    from runner.ship.rundata import open_run

    run = tmp_path / "run"
    assert cli.main(["run", str(RAGGED), "--run-dir", str(run), "-q"]) in (0, 1)
    rd = open_run(run, None, "test")
    spec = rd.spec
    assert len(spec.op.shapes) == 8 and rd.baseline and all(b for b in rd.baseline)
    trials = rd.history
    assert trials and all(t.status == "ok" for t in trials), [(t.status, t.reason) for t in trials]
    for t in trials:  # verified on ragged lengths, timed on full ones: both pass
        assert t.details["domain_checks"]
        assert all(sh["B"] * sh["L"] <= LIMIT for sh in t.details["domain_checks"])
    doc = compare_and_write(run, rounds=2, top=1, points=6, torch_compile=False)
    assert not (run / "compare-parts").exists() and "resumed" not in doc  # kept only until compare.json
    table = doc["range_table"]
    assert table["axes"] == ["B", "L"]
    # each grid point's box cut in four parts, each measured at its centre inside the bound
    boxes = {(g["B"], g["L"]) for g in spec.op.shapes[spec.op.named:] if spec.op.level_of(g) == 0}
    assert len(table["ranges"]) >= 4 * len(boxes)
    assert all(r["point"]["B"] * r["point"]["L"] <= LIMIT for r in table["ranges"])
    assert len(doc["curve"]) == 6
    for row in doc["curve"]:
        assert row["shape"]["B"] * row["shape"]["L"] <= LIMIT
        assert row["table_s"] and row["arms"]["torch eager"]["error"] is None
    assert doc["protocol"]["inputs"]["lens"] == ["randint [L, L + 1)"]
    assert math.isfinite(max(r.get("regret") or 0 for r in doc["curve"]))


def _ragged_boxes(path=RAGGED):
    s = load_spec(path)
    op = s.op
    grid = [{"shape": g, "use": [1] if g["L"] < 400 else [2], "times_s": {}, "eager_s": 9.0}
            for g in op.shapes[op.named:] if op.level_of(g) == 0]
    return s, ranges._boxes(s, op.axes, grid)


def test_compare_cuts_each_box_and_measures_its_parts_at_their_centres():
    s, boxes = _ragged_boxes()
    op = s.op
    prober = ChoosingProber("L", 400)
    parts = ranges._split_boxes(s, op.axes, boxes, prober, None)
    table = {"axes": op.axes, "ranges": parts, "exact": []}
    before = {"axes": op.axes, "ranges": boxes, "exact": []}
    always = lambda tid, shape: True  # noqa: E731
    # (4, 600) lies in the box of L = 256, which chose #1 there; its upper part's centre (L =
    # 514) measures #2, the neighbouring box's kernel, faster
    assert ranges.lookup(before, {"B": 4, "L": 600}, always) == 1
    assert ranges.lookup(table, {"B": 4, "L": 600}, always) == 2
    assert ranges.lookup(table, {"B": 4, "L": 100}, always) == 1
    # every size timed lies inside op.domain_where, and each part was offered its box's
    # kernels and its neighbours'
    assert prober.timed and all(op.in_domain(sh) is None for sh in prober.timed)
    offered = {tuple(sorted(sh.items())): set(ks) for sh, ks in zip(prober.timed, prober.lists)}
    for p in parts:
        key = tuple(sorted(p["point"].items()))
        if key not in offered:
            continue
        box = next(b for b in boxes if all(b["lo"][a] <= p["lo"][a] and p["hi"][a] <= b["hi"][a] for a in op.axes))
        near = set(box["use"]) | {b["use"][0] for b in boxes if b["use"] and ranges._touch(box, b, op.axes)}
        assert offered[key] == near
    assert {2} < {k for ks in offered.values() for k in ks}
    # the parts tile the boxes: every size of a box lies in exactly one part, inside that box
    # (the sizes of the dropped corner's box lie in none, as before)
    rng = __import__("random").Random(5)
    for _ in range(400):
        sh = {"B": rng.randint(1, 32), "L": rng.randint(16, 4096)}
        if not op.where_holds(sh):
            continue
        inside = [p for p in parts if all(p["lo"][a] <= sh[a] < p["hi"][a] for a in op.axes)]
        box = [b for b in boxes if all(b["lo"][a] <= sh[a] < b["hi"][a] for a in op.axes)]
        assert len(inside) == len(box) <= 1
        if box:
            assert all(box[0]["lo"][a] <= inside[0]["lo"][a] and inside[0]["hi"][a] <= box[0]["hi"][a] for a in op.axes)
    assert len(parts) == 4 * len(boxes)


class AlignedFallbackProber(ChoosingProber):
    """Kernels #1 and #2 at 2.0 everywhere; torch eager at 1.0 where `fast(shape)` holds, else
    5.0 (a library kernel whose path depends on how the sizes align)."""

    def __init__(self, fast, slow: float = 5.0):
        super().__init__("L", 0)
        self.fast, self.slow = fast, slow
        self.requests = 0

    def time(self, shapes, kernels, others=False, mode_of=None):
        self.timed += shapes
        self.lists += kernels
        out = []
        for sh, ks in zip(shapes, kernels):
            d = {f"#{k}": {"rounds": [2.0] * 2, "median": 2.0, "error": None} for k in ks}
            e = 1.0 if self.fast(sh) else self.slow
            d["torch eager"] = {"rounds": [e, e], "median": e, "error": None}
            out.append(d)
        return out


def test_a_part_falls_back_only_where_the_fallback_is_fast_around_its_centre():
    s, boxes = _ragged_boxes()
    op = s.op
    # torch eager fast at the parts' centres' L alone (as at sizes that align): a part must
    # not go to the fallback, whose twins (the next sizes) run at 5.0
    key = lambda sh: (sh["B"], sh["L"])  # noqa: E731
    centres = {key(p["point"]) for p in ranges._split_boxes(s, op.axes, boxes, ChoosingProber("L", 400), None)}
    prober = AlignedFallbackProber(lambda sh: key(sh) in centres)
    parts = ranges._split_boxes(s, op.axes, boxes, prober, None)
    timed = [p for p in parts if p["point"] in prober.timed and "times_s" in p]
    assert len(timed) > 4 and all(p["use"] for p in timed)
    aligned = [p for p in timed if key(p["point"]) in centres]
    # the twins: only the fallback, at the next sizes along the centre's largest axis, inside
    # the part and the domain
    twins = [sh for sh, ks in zip(prober.timed, prober.lists) if not ks]
    assert twins and all(op.in_domain(sh) is None for sh in twins)
    for p in timed:
        c = p["point"]
        a, b = ("L", "B") if c["L"] >= c["B"] else ("B", "L")
        mine = [sh for sh in twins if sh[b] == c[b] and 0 < sh[a] - c[a] <= 4 * ranges.TWINS]
        room = [v for v in range(c[a] + 1, min(p["hi"][a], c[a] + 1 + 4 * ranges.TWINS))
                if op.where_holds({**c, a: v})]
        assert sorted(sh[a] for sh in mine) == room[:ranges.TWINS]
    # by the centre alone, as before, each of them would have fallen back
    assert all(not ranges.choices_at(prober.time([p["point"]], [[1, 2]])[0], [1, 2])[0] for p in aligned)
    # torch eager at 3.0 at one size in eight (on the twins' axis), else 1.0: its mean over the
    # centre and its twins is at most 1.5, so the parts take the fallback over the kernels' 2.0
    prober = AlignedFallbackProber(lambda sh: max(sh["B"], sh["L"]) % 8 != 3, slow=3.0)
    parts = ranges._split_boxes(s, op.axes, boxes, prober, None)
    timed = [p for p in parts if p["point"] in prober.timed and "times_s" in p]
    assert timed and not any(p["use"] for p in timed)
    assert all(p["eager_s"] in (1.0, 1.5) for p in timed) and any(p["eager_s"] == 1.5 for p in timed)
    # slow (5.0) at every odd size: fast at the centre and every other twin, its mean (3.0)
    # loses to the kernels, whatever the centre's parity
    prober = AlignedFallbackProber(lambda sh: max(sh["B"], sh["L"]) % 2 == 0)
    parts = ranges._split_boxes(s, op.axes, boxes, prober, None)
    timed = [p for p in parts if p["point"] in prober.timed and "times_s" in p]
    assert all(p["use"] for p in timed) and any(max(p["point"].values()) % 2 == 0 for p in timed)


def test_the_fallbacks_mean_over_the_twins():
    def arm(*xs, error=None):
        return {"rounds": list(xs), "error": error}
    centre = {"torch eager": arm(1.0, 1.0), "loop": arm(3.0, 3.0)}
    twins = [{"torch eager": arm(6.0, 6.0), "loop": arm(3.0, 3.0)},
             {"torch eager": arm(6.0, 6.0), "loop": arm(2.0, 2.0)}]
    # eager: the mean of 1, 6 and 6; the loop's of 3, 3 and 2
    assert ranges.best_fallback(centre, ["loop"], twins) == ("loop", 8 / 3, 8 / 3)
    assert ranges.best_fallback(centre, ["loop"]) == (None, 1.0, 1.0)
    assert ranges.best_fallback(centre, [], twins) == (None, 13 / 3, 13 / 3)  # the mean, not the median
    # an arm that failed at a twin is no fallback of the range, however fast elsewhere
    twins[1]["loop"] = arm(2.0, 2.0, error="not exact on the judge's inputs")
    assert ranges.best_fallback(centre, ["loop"], twins) == (None, 13 / 3, 13 / 3)
    # a kernel at 2.5 beats the twins' fallback, not the centre's
    centre["#7"] = arm(2.5, 2.5)
    assert ranges.choices_at(centre, [7], ["loop"], twins)[0] == [(7, 2.5)]
    assert ranges.choices_at(centre, [7], ["loop"])[0] == []


def test_a_points_twins_stay_inside_its_own_range(project):
    # one axis (N) with few-rows levels: every point's twins lie above it and below where its
    # range ends (the log-midpoint with the next point up), at the point's own rows
    from types import SimpleNamespace

    def small(d):  # short rows, where points lie a few sizes apart
        d["op"]["domain"]["N"] = {"min": 1, "max": 64}
        d["op"]["shapes"] = [{"M": 4, "N": 32}]
        d["op"]["extra_shapes"] = [{"M": 3, "N": 5}]
        d["op"].pop("held_out_shapes", None)
    s = load_spec(range_spec(project, small))
    op = s.op
    prober = AlignedFallbackProber(lambda sh: True)
    history = [SimpleNamespace(id=k, status="ok", times=[1.0] * len(op.shapes), params={}, variant=None,
                               details={}) for k in (1, 2)]
    ranges.build(s, history, prober, top=2, refine=0)
    ns = sorted({sh["N"] for sh in op.shapes})
    points = {(sh["M"], sh["N"]) for sh in op.shapes}
    twins = [sh for sh, ks in zip(prober.timed, prober.lists) if not ks and (sh["M"], sh["N"]) not in points]
    assert twins
    for tw in twins:
        below = max(n for n in ns if n < tw["N"] and (tw["M"], n) in points)
        above = [n for n in ns if n > below]
        end = ranges._geo_mid(below, above[0]) + 1 if above else op.domain["N"].max + 1
        assert below < tw["N"] < end and tw["N"] - below <= 4 * ranges.TWINS
        assert op.in_domain(tw) is None


def test_a_twin_is_timed_in_its_points_launch_mode():
    # the prober asks the worker to time each twin in the mode its point's arms ran in
    from types import SimpleNamespace

    jobs = []

    class Worker:
        def request(self, msg, timeout):
            jobs.append(msg[1])
            return {"status": "ok", "shapes": [{} for _ in msg[1]["shapes"]]}

    spec = SimpleNamespace(op=SimpleNamespace(compare_arms=lambda: {}, fallbacks=()))
    pr = ranges.Prober(spec, None, Worker(), {}, rounds=2, timeout_s=10)
    a, b = {"N": 100}, {"N": 200}
    out = ranges.time_with_twins(pr, [a, b], [[], []], [[{"N": 101}, {"N": 102}], [{"N": 201}]])
    # each shape followed by its twins, which name it
    assert jobs[0]["shapes"] == [a, {"N": 101}, {"N": 102}, b, {"N": 201}]
    assert jobs[0]["mode_of"] == [None, 0, 0, None, 3]
    assert [len(t) for _, t in out] == [2, 1]
    ranges.time_with_twins(pr, [a], [[]], [[]])  # no twins: no mode_of
    assert "mode_of" not in jobs[1]


def test_a_named_shape_keeps_its_own_sizes_choice_and_its_range_the_twins(tmp_path):
    from types import SimpleNamespace

    # the named shape is a grid point too (B 6, L 256): the grid takes it as named
    s = load_spec(ragged_spec(tmp_path, lambda d: d["op"].update(shapes=[{"B": 6, "L": 256}])))
    op = s.op
    assert op.named == 1 and op.shapes[0] == {"B": 6, "L": 256}
    # torch eager fast at L = 256 alone
    prober = AlignedFallbackProber(lambda sh: sh["L"] == 256)
    history = [SimpleNamespace(id=k, status="ok", times=[1.0] * len(op.shapes), params={"ACC": k}, variant=None,
                               details={}) for k in (1, 2)]
    table = ranges.build(s, history, prober, top=2, refine=0)
    ex = table["exact"][0]
    assert ex["shape"] == op.shapes[0] and ex["use"] == [] and ex["eager_s"] == 1.0  # its own size: eager wins
    # the range holding it judged the fallback over the twins (L 257 .. 259): a kernel
    r = next(r for r in table["ranges"] if all(r["lo"][a] <= op.shapes[0][a] < r["hi"][a] for a in op.axes))
    assert r["point"] == op.shapes[0] and r["use"] == [1, 2] and r["eager_s"] == (1.0 + 3 * 5.0) / 4
    assert [sh["L"] for sh, ks in zip(prober.timed, prober.lists) if sh["B"] == 6 and not ks][:3] == [257, 258, 259]


def test_a_part_centred_outside_domain_where_keeps_its_box_list_untimed(tmp_path):
    # B * L <= 2^13: the box of (32, 256) holds sizes up to it, and its upper parts' centres
    # (B 27, L 514) lie past it
    s, boxes = _ragged_boxes(ragged_spec(tmp_path, lambda d: d["op"].update(domain_where="B * L <= 2 ** 13")))
    op = s.op
    prober = ChoosingProber("L", 400)
    parts = ranges._split_boxes(s, op.axes, boxes, prober, None)
    untimed = [p for p in parts if p["point"] not in prober.timed]
    assert untimed and all(op.in_domain(sh) is None for sh in prober.timed)
    for p in untimed:
        box = next(b for b in boxes if all(b["lo"][a] <= p["lo"][a] and p["hi"][a] <= b["hi"][a] for a in op.axes))
        assert p["use"] == box["use"] and p["point"] == box["point"]
        centre = {a: ranges._geo_mid(p["lo"][a], p["hi"][a] - 1) for a in op.axes}
        assert not op.where_holds(op.point(centre))


def test_a_long_timing_request_goes_in_parts_that_keep_each_twin_with_its_shape():
    from types import SimpleNamespace

    # without twins: parts of PART shapes
    assert ranges.request_parts(10, None, size=4) == [(0, 4), (4, 8), (8, 10)]
    assert ranges.request_parts(4, None, size=4) == [(0, 4)]
    # a twin that names a shape before a cut moves the cut on
    mode_of = [None, 0, 0, None, 3, None, None, 6, 6, 6]
    parts = ranges.request_parts(10, mode_of, size=2)
    assert parts == [(0, 3), (3, 5), (5, 10)]
    for a, b in parts:
        assert all(m is None or a <= m < b for m in mode_of[a:b])

    jobs, lines = [], []

    class Worker:  # answers each shape with its own size, so the order can be checked
        def request(self, msg, timeout):
            jobs.append(msg[1])
            return {"status": "ok", "shapes": [{"size": sh["N"]} for sh in msg[1]["shapes"]]}

    spec = SimpleNamespace(op=SimpleNamespace(compare_arms=lambda: {}, fallbacks=()))
    pr = ranges.Prober(spec, None, Worker(), {}, rounds=2, timeout_s=10)
    pr.log = lines.append
    n = ranges.PART * 2 + 5
    shapes = [{"N": 1000 + i} for i in range(n)]
    twins = [[{"N": 5000 + i}] if i % 3 == 0 else [] for i in range(n)]
    out = ranges.time_with_twins(pr, shapes, [[] for _ in shapes], twins)
    assert len(jobs) > 2 and all(len(j["shapes"]) <= ranges.PART + 1 for j in jobs)
    for j in jobs:  # each part's twins name a shape of that part, by its place there
        for i, m in enumerate(j["mode_of"]):
            if m is not None:
                assert j["shapes"][i]["N"] - 5000 == j["shapes"][m]["N"] - 1000
    # the results come back to their shapes
    assert [r["size"] for r, _ in out] == [sh["N"] for sh in shapes]
    assert [[t["size"] for t in ts] for _, ts in out] == [[t["N"] for t in tw] for tw in twins]
    # one timing request: its first line, a progress line a part but the last, its last line
    assert lines[0].startswith("timing request 1:") and f"in {len(jobs)} parts" in lines[0]
    assert len([x for x in lines if "to go" in x]) == len(jobs) - 1
    assert lines[-1].startswith("timing request 1 done")
