"""Search strategies (tpe, gp where it runs, pattern): valid, new, seeded, resumable, exhaustive."""

import math
import subprocess
import sys

import pytest

import runner.search.agents.pattern  # noqa: F401  (registration)
from runner.search.agents import STRATEGIES, Seen, make_agent
from runner.core.expr import compile_expr
from runner.search.space import Param, Space, config_key

try:
    import runner.search.agents.optuna_search  # noqa: F401  (registration)
except ImportError:  # optuna missing: only "pattern" is tested
    pass

SEARCH = [s for s in ("tpe", "gp", "pattern") if s in STRATEGIES]
FAILURES = ("wrong", "fault", "hang", "compile_error", "forbidden", "pruned", "impossible", "error")


def space():
    """48 points before constraints, 36 valid; the constraints use the shape symbols M and N."""
    syms = {"A", "B", "C", "D", "M", "N"}
    return Space(
        (Param("A", (1, 2, 4, 8)), Param("B", ("x", "y", "z")), Param("C", (True, False)),
         Param("D", (32, 64))),
        (compile_expr("A * D <= M", syms),                  # M = 512 and 256: A * D <= 256
         compile_expr("not C or N % (A * D) == 0", syms)),  # N = 128 and 256: C needs A * D <= 128
        ({"M": 512, "N": 128}, {"M": 256, "N": 256}),
    )


def tiny():
    syms = {"A", "B", "N"}
    return Space((Param("A", (1, 2, 3)), Param("B", (1, 2))), (compile_expr("A * B <= N", syms),),
                 ({"N": 4}, {"N": 3}))


def objective(cfg):
    """A made-up landscape with a clear best (A=2, B='y', C=True, D=32) and some failures."""
    a = math.log2(cfg["A"])
    b = {"x": 0.3, "y": 0.0, "z": 0.5}[cfg["B"]]
    return 1e-4 * math.exp((a - 1) ** 2 * 0.4 + b + (0.0 if cfg["C"] else 0.2) + (cfg["D"] == 64) * 0.1)


def verdict(cfg, fail_every=0):
    if fail_every and sum(map(ord, config_key(cfg))) % fail_every == 0:
        return Seen(cfg, FAILURES[len(config_key(cfg)) % len(FAILURES)], "made up", None)
    return Seen(cfg, "ok", "", objective(cfg))


def drive(agent, sp, limit=200, n=1, judge=verdict):
    hist = []
    while len(hist) < limit:
        props = agent.propose(hist, n)
        if not props:
            break
        assert len(props) <= n
        for cfg in props:
            hist.append(judge(cfg))
    return hist


@pytest.mark.parametrize("name", SEARCH)
@pytest.mark.parametrize("n", [1, 3])
def test_never_repeats_nor_leaves_the_space_then_exhausts(name, n):
    sp = space()
    valid = {config_key(c) for c in sp}
    assert len(valid) == 36
    hist = drive(make_agent(name, sp, 0, {}), sp, n=n, judge=lambda c: verdict(c, fail_every=3))
    keys = [config_key(h.params) for h in hist]
    assert len(keys) == len(set(keys)), "a configuration was proposed twice"
    assert all(sp.contains(h.params) is None for h in hist), "an invalid configuration was proposed"
    assert set(keys) == valid  # the whole valid space, then []
    assert make_agent(name, sp, 0, {}).propose(hist, 1) == []


@pytest.mark.parametrize("name", SEARCH)
def test_tiny_space_exhausts_then_returns_nothing(name):
    sp = tiny()
    hist = drive(make_agent(name, sp, 5, {}), sp, judge=lambda c: Seen(c, "ok", "", 1e-3 * (c["A"] + c["B"])))
    assert sorted((h.params["A"], h.params["B"]) for h in hist) == [(1, 1), (1, 2), (2, 1), (3, 1)]
    agent = make_agent(name, sp, 5, {})
    assert agent.propose(hist, 1) == [] and agent.propose(hist, 4) == []


@pytest.mark.parametrize("name", SEARCH)
def test_seeded(name):
    sp = space()
    runs = {s: [config_key(h.params) for h in drive(make_agent(name, sp, s, {}), sp, limit=12)]
            for s in (0, 1, 2)}
    again = [config_key(h.params) for h in drive(make_agent(name, sp, 0, {}), sp, limit=12)]
    assert runs[0] == again
    assert len({tuple(r) for r in runs.values()}) == 3, "different seeds should search differently"


@pytest.mark.parametrize("name", SEARCH)
def test_every_trial_failed(name):
    sp = space()
    for status in FAILURES:
        first = list(sp)[:4]
        hist = [Seen(c, status, "made up", None) for c in first]
        props = make_agent(name, sp, 1, {}).propose(hist, 2)
        assert len(props) == 2
        assert all(sp.contains(c) is None and config_key(c) not in {config_key(x) for x in first}
                   for c in props)
    hist = drive(make_agent(name, sp, 1, {}), sp, judge=lambda c: Seen(c, "compile_error", "no", None))
    assert len({config_key(h.params) for h in hist}) == 36


@pytest.mark.parametrize("name", SEARCH)
def test_odd_history_entries_are_tolerated(name):
    sp = space()
    hist = [Seen({"A": 1, "B": "x", "C": False, "D": 32}, "ok", "", None),        # ok but not timed
            Seen({"A": 99, "B": "x", "C": False, "D": 32}, "ok", "", 1e-4),       # off the domain
            Seen({"A": 2, "B": "q"}, "error", "an older spec's point", None),     # missing a name
            Seen({"A": 2, "B": "y", "C": True, "D": 32}, "ok", "", 0.0)]          # zero time
    props = make_agent(name, sp, 0, {}).propose(hist, 3)
    assert len(props) == 3 and len({config_key(c) for c in props}) == 3
    tried = {config_key(h.params) for h in hist}
    assert all(sp.contains(c) is None and config_key(c) not in tried for c in props)


@pytest.mark.parametrize("name", SEARCH)
def test_resumed_agent_proposes_what_the_uninterrupted_run_did(name):
    sp = space()
    judge = lambda c: verdict(c, fail_every=4)  # noqa: E731
    full = drive(make_agent(name, sp, 3, {}), sp, judge=judge)
    assert len(full) == 36
    for k in (0, 1, 2, 3, 5, 8, 13, 21, 34, 35):
        fresh = make_agent(name, sp, 3, {})
        assert fresh.propose(full[:k], 1) == [full[k].params], f"resumed after {k} trials"


@pytest.mark.parametrize("name", SEARCH)
def test_finds_the_best_of_the_made_up_landscape(name):
    sp = space()
    best = min(sp, key=objective)
    hist = drive(make_agent(name, sp, 0, {}), sp)
    assert best in [h.params for h in hist]


def test_pattern_walks_from_the_incumbent():
    sp = space()
    agent = make_agent("pattern", sp, 0, {"init": 2})
    hist = drive(agent, sp, limit=2)  # the random start
    inc = min((h for h in hist if h.status == "ok"), key=lambda h: h.objective).params
    nxt = agent.propose(hist, 1)[0]

    def step(k):  # B's values are names: any other one is a single step
        if isinstance(inc[k], str):
            return int(nxt[k] != inc[k])
        return abs(sp.param(k).index(nxt[k]) - sp.param(k).index(inc[k]))
    assert sum(map(step, sp.names)) == 1 or nxt in agent._repaired(inc)


def test_pattern_steps_to_any_other_value_of_a_named_domain():
    """A domain of names (softmax's HOLD: f32, bf16, none, tma, ring) has no order: from its
    first value every other one is one step away, as a number's two neighbours are; with
    categorical: false the domain's listed order is its order again."""
    sp = Space((Param("H", ("f32", "bf16", "none", "tma", "ring")), Param("E", (8, 16, 32))))
    ring = lambda opts, cfg: {config_key(c) for c, _ in make_agent("pattern", sp, 0, opts)._ring(cfg, 1)}  # noqa: E731
    got = ring({}, {"H": "f32", "E": 16})
    assert got == {config_key(c) for c in ({"H": h, "E": 16} for h in ("bf16", "none", "tma", "ring"))} | \
        {config_key({"H": "f32", "E": 8}), config_key({"H": "f32", "E": 32})}
    assert ring({"categorical": False}, {"H": "f32", "E": 16}) == \
        {config_key(c) for c in ({"H": "bf16", "E": 16}, {"H": "f32", "E": 8}, {"H": "f32", "E": 32})}
    # two-step moves pair a named value with a number's step, and never step a name twice
    two = {config_key(c) for c, _ in make_agent("pattern", sp, 0, {})._ring({"H": "none", "E": 16}, 2)}
    assert config_key({"H": "ring", "E": 32}) in two and config_key({"H": "f32", "E": 8}) in two
    assert config_key({"H": "ring", "E": 16}) not in two and config_key({"H": "f32", "E": 16}) not in two
    # no mirror move along names: the "promise" order has nothing to read there
    agent = make_agent("pattern", sp, 0, {})
    assert agent._mirror({"H": "none", "E": 16}, (("H", 2),)) is None
    assert agent._mirror({"H": "none", "E": 16}, (("E", 1),)) == {"H": "none", "E": 8}


def test_pattern_repairs_a_blocked_name_with_the_fewest_changed_names():
    """A step that a constraint blocks is repaired with the nearest valid point, where a
    changed name counts one step wherever it sits in the list: from (G=a, H=x, T=1), H=y needs
    G=d or T=4; G=d is one step (a name), T=4 is two."""
    syms = {"G", "H", "T"}
    sp = Space((Param("G", ("a", "b", "c", "d")), Param("H", ("x", "y")), Param("T", (1, 2, 4))),
               (compile_expr("H == 'x' or G == 'd' or T == 4", syms),))
    agent = make_agent("pattern", sp, 0, {})
    fixes = [c for c, m in agent._repaired({"G": "a", "H": "x", "T": 1}) if m == (("H", 1),)]
    assert fixes == [{"G": "d", "H": "y", "T": 1}]
    ring = agent._ring({"G": "a", "H": "x", "T": 1}, 1)
    assert len({config_key(c) for c, _ in ring}) == len(ring)  # every point once


def test_pattern_repairs_a_step_a_constraint_blocks():
    # H=1 needs T >= 4; from (T=1, H=0) the step H -> 1 is blocked and repaired to (T=4, H=1).
    syms = {"T", "H"}
    sp = Space((Param("T", (1, 2, 4, 8)), Param("H", (0, 1))), (compile_expr("H == 0 or T >= 4", syms),))
    agent = make_agent("pattern", sp, 0, {})
    assert [c for c, _ in agent._repaired({"T": 1, "H": 0})] == [{"T": 4, "H": 1}]
    hist = [Seen({"T": 1, "H": 0}, "ok", "", 1.0), Seen({"T": 2, "H": 0}, "ok", "", 2.0)]
    assert agent.propose(hist, 1) == [{"T": 4, "H": 1}]


def test_pattern_restarts_and_searches_around_the_restart():
    sp = Space((Param("P", tuple(range(10))),))
    t = lambda p, obj: Seen({"P": p}, "ok", "", obj)  # noqa: E731
    hist = [t(5, 1.0), t(4, 2.0), t(6, 2.0), t(3, 2.0), t(7, 2.0)]  # 5's neighbourhood, all worse
    for seed in range(8):
        agent = make_agent("pattern", sp, seed, {})
        r = agent.propose(hist, 1)[0]["P"]
        assert r in (0, 1, 2, 8, 9)  # a random untried point
        nxt = agent.propose(hist + [t(r, 1.5)], 1)[0]["P"]
        assert 0 < abs(nxt - r) <= 2 and nxt not in (3, 4, 5, 6, 7), (seed, r, nxt)
        # a restart that failed is no center: draw again
        again = agent.propose(hist + [Seen({"P": r}, "wrong", "made up", None)], 1)[0]["P"]
        assert again in {0, 1, 2, 8, 9} - {r}


def test_pattern_with_shapes_alternates_with_a_shapes_own_best():
    """shapes: alternate: with per-shape times, every other proposal is a neighbour of the
    fastest configuration of a shape the incumbent does not win (the default); "off" never
    looks at per-shape times; an unknown mode is an error."""
    sp = Space((Param("P", tuple(range(10))),))
    t = lambda p, obj, times: Seen({"P": p}, "ok", "", obj, times=times)  # noqa: E731
    # P=2 has the best geometric mean; P=7 is far faster on shape 1
    hist = [t(2, 1.0, (0.5, 2.0)), t(7, 1.2, (2.88, 0.5)), t(3, 1.1, (0.6, 2.0))]
    alt = make_agent("pattern", sp, 0, {"shapes": "alternate"})
    assert alt.propose(hist, 1)[0]["P"] in (6, 8)  # 3 trials: an odd turn, around P=7
    assert alt.propose(hist[:2] + [t(1, 1.1, (0.6, 2.0)), t(3, 1.1, (0.6, 2.0))], 1)[0]["P"] not in (6, 8)
    assert make_agent("pattern", sp, 0, {}).propose(hist, 1)[0]["P"] in (6, 8)  # the default
    off = make_agent("pattern", sp, 0, {"shapes": "off"})
    assert off.propose(hist, 1)[0]["P"] == 1  # the incumbent's last untried neighbour
    with pytest.raises(ValueError, match="shapes"):
        make_agent("pattern", sp, 0, {"shapes": "yes"})


def test_pattern_with_shapes_reaches_the_dispatch_table_sooner_on_the_whole_recorded_space():
    """The replay figure behind the option (docs/agents.md): on softmax-v1-h200, the one
    dataset holding a whole space, the table comes within 3% of the best table in about half
    the evaluations."""
    from pathlib import Path

    from runner.search import replay as rp

    ds = rp.load(Path(__file__).resolve().parent.parent / "datasets" / "softmax-v1-h200.json")
    off = rp.replay(ds, "pattern", range(25), {"shapes": "off"})["table"][0.03]["median"]
    alt = rp.replay(ds, "pattern", range(25))["table"][0.03]["median"]
    assert alt <= off / 1.5, (alt, off)


def test_optuna_is_imported_only_when_an_agent_is_built():
    code = ("import sys, runner.search.agents, runner.search.agents.optuna_search, runner.search.agents.pattern, "
            "runner.search.replay; "
            "assert 'optuna' not in sys.modules, 'optuna imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_search_strategies_registered():
    assert "pattern" in STRATEGIES
    pytest.importorskip("optuna")
    assert "tpe" in STRATEGIES
