"""runner.search.space: parameter domains, constraints, sampling, neighbours."""

import itertools
import json
import random

import pytest

from runner.core.errors import ExprError
from runner.core.expr import compile_expr
from runner.search.space import Param, Space, config_key, domain_problem, param_values


# ---------------------------------------------------------------- param_values

@pytest.mark.parametrize("spec, values", [
    ([4, 2, 8], (4, 2, 8)),  # list order kept
    (["a", "b"], ("a", "b")),
    ({"values": [True, False]}, (True, False)),
    ({"values": [0.5, 1.5]}, (0.5, 1.5)),
    ({"range": {"min": 3, "max": 6}}, (3, 4, 5, 6)),  # max inclusive
    ({"range": {"min": 1, "max": 10, "step": 4}}, (1, 5, 9)),
    ({"range": {"min": 0, "max": 12, "step": 4}}, (0, 4, 8, 12)),
    ({"range": {"min": 5, "max": 5}}, (5,)),
    ({"pow2": {"min": 16, "max": 256}}, (16, 32, 64, 128, 256)),
    ({"pow2": {"min": 1, "max": 8}}, (1, 2, 4, 8)),
    ({"pow2": {"min": 32, "max": 32}}, (32,)),
    ({"pow2": {"min": 16, "max": 100}}, (16, 32, 64)),  # max not a power: stop below it
])
def test_param_values(spec, values):
    got = param_values(spec)
    assert got == values
    assert isinstance(got, tuple)
    assert [type(v) for v in got] == [type(v) for v in values]


def test_param_values_unknown_form():
    with pytest.raises(ValueError, match="unknown parameter form"):
        param_values({"linspace": {"min": 0, "max": 1}})


# ---------------------------------------------------------------- domain_problem

@pytest.mark.parametrize("values, problem", [
    ((1, 2.0), "values mix types (float, int)"),
    ((1, True), "values mix types (bool, int)"),
    (("a", 1), "values mix types (int, str)"),
    ((1, 2, 1), "values repeat"),
    (("x", "x"), "values repeat"),
    ((), "no values"),
])
def test_domain_problem(values, problem):
    assert domain_problem(values) == problem


@pytest.mark.parametrize("values", [(1, 2, 3), ("a", "b"), (True, False), (0.5, 1.0), (7,)])
def test_domain_ok(values):
    assert domain_problem(values) is None


# ---------------------------------------------------------------- Space basics

def _space(constraints=(), shapes=({},)):
    return Space(
        (Param("BLOCK", (32, 64, 128, 256)), Param("VEC", (1, 2, 4)), Param("LAYOUT", ("row", "col"))),
        tuple(compile_expr(c) for c in constraints),
        tuple(shapes),
    )


def test_unconstrained_iteration_is_full_grid_last_fastest():
    s = _space()
    configs = list(s)
    assert s.size == 24
    assert len(configs) == 24
    assert configs[0] == {"BLOCK": 32, "VEC": 1, "LAYOUT": "row"}
    assert configs[1] == {"BLOCK": 32, "VEC": 1, "LAYOUT": "col"}
    assert configs[2] == {"BLOCK": 32, "VEC": 2, "LAYOUT": "row"}
    assert configs[-1] == {"BLOCK": 256, "VEC": 4, "LAYOUT": "col"}
    assert len({config_key(c) for c in configs}) == 24


def test_names_and_param_lookup():
    s = _space()
    assert s.names == ["BLOCK", "VEC", "LAYOUT"]
    assert s.param("VEC").values == (1, 2, 4)
    assert s.param("VEC").kind == "int"
    assert s.param("LAYOUT").kind == "str"
    with pytest.raises(KeyError):
        s.param("NOPE")


def test_param_index_is_type_strict():
    p = Param("VEC", (1, 2, 4))
    assert p.index(4) == 2
    with pytest.raises(ValueError):
        p.index(True)  # True == 1 but is not an int value of the domain
    with pytest.raises(ValueError):
        p.index(2.0)
    with pytest.raises(ValueError):
        p.index(3)


def test_iteration_respects_constraints():
    s = _space(["BLOCK * VEC <= 256", "LAYOUT == 'row' or VEC == 1"])
    configs = list(s)
    brute = [dict(zip(s.names, combo)) for combo in itertools.product(*(p.values for p in s.params))]
    want = [c for c in brute
            if c["BLOCK"] * c["VEC"] <= 256 and (c["LAYOUT"] == "row" or c["VEC"] == 1)]
    assert configs == want
    assert len(configs) < s.size
    assert all(s.contains(c) is None for c in configs)


def test_constraints_with_shape_symbols_hold_for_every_shape():
    # BLOCK * VEC must divide every N; 512 divides 512 but not 768, so products of 512+ are out
    s = _space(["N % (BLOCK * VEC) == 0"], shapes=({"N": 512}, {"N": 768}))
    got = {(c["BLOCK"], c["VEC"]) for c in s}
    want = {(b, v) for b in (32, 64, 128, 256) for v in (1, 2, 4)
            if 512 % (b * v) == 0 and 768 % (b * v) == 0}
    assert got == want
    # 512 alone would allow BLOCK*VEC = 512, but 768 % 512 != 0
    assert (128, 4) not in got and (256, 2) not in got
    assert (256, 1) in got
    assert s.violated({"BLOCK": 256, "VEC": 2, "LAYOUT": "row"}) == "N % (BLOCK * VEC) == 0"


def test_constraint_on_single_shape_vs_two_shapes_differs():
    one = _space(["BLOCK <= N"], shapes=({"N": 256},))
    two = _space(["BLOCK <= N"], shapes=({"N": 256}, {"N": 64}))
    assert {c["BLOCK"] for c in one} == {32, 64, 128, 256}
    assert {c["BLOCK"] for c in two} == {32, 64}


def test_constraint_using_missing_symbol_raises_expr_error():
    s = _space(["BLOCK <= M"])
    with pytest.raises(ExprError):
        list(s)


def test_unsatisfiable_space_is_empty():
    s = _space(["BLOCK > 1000"])
    assert list(s) == []
    assert s.sample(random.Random(0), tries=50) is None


# ---------------------------------------------------------------- contains

def test_contains_valid():
    s = _space(["BLOCK * VEC <= 256"])
    assert s.contains({"BLOCK": 64, "VEC": 4, "LAYOUT": "col"}) is None


def test_contains_missing():
    s = _space()
    r = s.contains({"BLOCK": 64})
    assert r == "missing LAYOUT, VEC"


def test_contains_unknown():
    s = _space()
    r = s.contains({"BLOCK": 64, "VEC": 1, "LAYOUT": "row", "EXTRA": 3})
    assert r == "unknown EXTRA"


def test_contains_missing_and_unknown():
    r = _space().contains({"BLOCK": 64, "VEC": 1, "TYPO": "row"})
    assert r == "missing LAYOUT; unknown TYPO"


def test_contains_out_of_domain():
    s = _space()
    r = s.contains({"BLOCK": 48, "VEC": 1, "LAYOUT": "row"})
    assert r is not None
    assert "BLOCK=48" in r and "[32, 64, 128, 256]" in r
    r = s.contains({"BLOCK": 64, "VEC": 1, "LAYOUT": "diag"})
    assert "LAYOUT='diag'" in r


def test_contains_wrong_type_is_out_of_domain():
    r = _space().contains({"BLOCK": 64, "VEC": True, "LAYOUT": "row"})
    assert r is not None and r.startswith("VEC=True")


def test_contains_constraint_reason():
    s = _space(["BLOCK * VEC <= 256", "VEC < 4"])
    r = s.contains({"BLOCK": 128, "VEC": 4, "LAYOUT": "row"})
    assert r == "violates constraint 'BLOCK * VEC <= 256'"
    r = s.contains({"BLOCK": 32, "VEC": 4, "LAYOUT": "row"})
    assert r == "violates constraint 'VEC < 4'"


# ---------------------------------------------------------------- sample

def test_sample_deterministic_for_seed():
    s = _space(["BLOCK * VEC <= 256"])
    a = [s.sample(random.Random(42)) for _ in range(3)]
    r1, r2 = random.Random(7), random.Random(7)
    seq1 = [s.sample(r1) for _ in range(20)]
    seq2 = [s.sample(r2) for _ in range(20)]
    assert a[0] == a[1] == a[2]
    assert seq1 == seq2
    assert len({config_key(c) for c in seq1}) > 1  # it does explore


def test_sample_always_valid():
    s = _space(["BLOCK * VEC <= 128", "LAYOUT == 'row' or BLOCK == 32"], shapes=({"N": 1}, {"N": 2}))
    valid = {config_key(c) for c in s}
    rng = random.Random(0)
    for _ in range(300):
        c = s.sample(rng)
        assert c is not None
        assert s.contains(c) is None
        assert config_key(c) in valid


def test_sample_gives_none_when_no_valid_point():
    s = _space(["BLOCK == 48"])
    assert s.sample(random.Random(1), tries=20) is None


# ---------------------------------------------------------------- neighbours

def _step_diff(a, b, space):
    diffs = [n for n in space.names if a[n] != b[n]]
    assert len(diffs) == 1, (a, b)
    p = space.param(diffs[0])
    return abs(p.index(a[diffs[0]]) - p.index(b[diffs[0]]))


def test_neighbours_of_interior_point():
    s = _space()
    cfg = {"BLOCK": 64, "VEC": 2, "LAYOUT": "row"}
    ns = s.neighbours(cfg)
    keys = {config_key(n) for n in ns}
    want = [
        {"BLOCK": 32, "VEC": 2, "LAYOUT": "row"},
        {"BLOCK": 128, "VEC": 2, "LAYOUT": "row"},
        {"BLOCK": 64, "VEC": 1, "LAYOUT": "row"},
        {"BLOCK": 64, "VEC": 4, "LAYOUT": "row"},
        {"BLOCK": 64, "VEC": 2, "LAYOUT": "col"},
    ]
    assert keys == {config_key(w) for w in want}
    assert len(ns) == 5
    assert cfg == {"BLOCK": 64, "VEC": 2, "LAYOUT": "row"}  # input not mutated


def test_neighbours_at_domain_edges():
    s = _space()
    ns = s.neighbours({"BLOCK": 32, "VEC": 4, "LAYOUT": "col"})
    assert len(ns) == 3  # BLOCK up, VEC down, LAYOUT back


def test_neighbours_are_one_step_and_valid():
    s = _space(["BLOCK * VEC <= 256", "LAYOUT == 'row' or VEC == 1"])
    for cfg in s:
        for n in s.neighbours(cfg):
            assert s.contains(n) is None
            assert _step_diff(cfg, n, s) == 1


def test_neighbours_drop_invalid():
    s = _space(["BLOCK * VEC <= 256"])
    ns = s.neighbours({"BLOCK": 128, "VEC": 2, "LAYOUT": "row"})
    assert {"BLOCK": 256, "VEC": 2, "LAYOUT": "row"} not in ns
    assert {"BLOCK": 128, "VEC": 4, "LAYOUT": "row"} not in ns
    assert {"BLOCK": 64, "VEC": 2, "LAYOUT": "row"} in ns


# ---------------------------------------------------------------- config_key

def test_config_key_order_independent():
    a = {"BLOCK": 64, "VEC": 2, "LAYOUT": "row"}
    b = {"LAYOUT": "row", "VEC": 2, "BLOCK": 64}
    assert config_key(a) == config_key(b)
    assert json.loads(config_key(a)) == a


def test_config_key_distinguishes_values_and_types():
    assert config_key({"a": 1}) != config_key({"a": 2})
    assert config_key({"a": 1}) != config_key({"a": True})
    assert config_key({"a": 1}) != config_key({"a": 1.0})
    assert config_key({"a": 1}) != config_key({"a": "1"})
    assert config_key({"a": 1, "b": 2}) == '{"a":1,"b":2}'
