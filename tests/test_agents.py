"""Built-in agents: grid order, seeded random, never a repeat, exhaustion."""

from runner.search.agents import STRATEGIES, Seen, make_agent
from runner.core.expr import compile_expr
from runner.search.space import Param, Space, config_key


def space():
    return Space((Param("A", (1, 2, 4, 8)), Param("B", ("x", "y")), Param("C", (True, False))),
                 (compile_expr("A * 2 <= M", {"A", "M"}),), ({"M": 8},))


def drive(agent, limit=100):
    hist = []
    while len(hist) < limit:
        props = agent.propose(hist, 1)
        if not props:
            break
        hist.append(Seen(props[0], "ok", "", 1.0))
    return [h.params for h in hist]


def test_registry():
    assert {"grid", "random"} <= set(STRATEGIES)


def test_grid_enumerates_valid_space_in_order():
    got = drive(make_agent("grid", space(), 0, {}))
    want = list(space())
    assert got == want and len(want) == 12  # A=8 violates A*2 <= 8
    assert all(c["A"] != 8 for c in got)


def test_grid_spread_visits_every_configuration_and_covers_the_space_early():
    from runner.search.agents.grid import spread

    sp = Space((Param("A", tuple(range(8))), Param("B", tuple(range(5)))), (), ({},))
    got = drive(make_agent("grid", sp, 0, {"order": "spread"}))
    assert sorted(map(config_key, got)) == sorted(map(config_key, sp)) and len(got) == 40
    # the space's own order reaches A = 7 only after 35 trials; spread has every A in 8
    assert {c["A"] for c in got[:8]} == set(range(8))
    assert drive(make_agent("grid", sp, 0, {}))[:8] == list(sp)[:8]  # the default: the space's order
    for n in (40, 158, 188):  # no stretch of the space's order longer than 2n/k is left out of k
        s = spread(n)
        for k in (4, 8, 16, 32):
            taken = sorted(s[:k]) + [n]
            assert max(b - a for a, b in zip([-1] + taken, taken)) <= 2 * n / k + 1
    assert got == drive(make_agent("grid", sp, 0, {"order": "spread"}))  # pure: the same order
    for n in (1, 2, 7, 40, 158):
        assert sorted(spread(n)) == list(range(n))


def test_grid_skips_what_history_holds():
    sp = space()
    first = list(sp)[:3]
    agent = make_agent("grid", sp, 0, {})
    hist = [Seen(c, "ok", "", 1.0) for c in first]
    assert agent.propose(hist, 1)[0] == list(sp)[3]


def test_random_is_seeded_and_never_repeats():
    a = drive(make_agent("random", space(), 7, {}))
    b = drive(make_agent("random", space(), 7, {}))
    c = drive(make_agent("random", space(), 8, {}))
    assert a == b and a != c
    keys = [config_key(x) for x in a]
    assert len(keys) == len(set(keys)) == 12  # the whole valid space, once each, then []
    assert all(space().contains(x) is None for x in a)


def test_random_resumes_where_it_left_off():
    full = drive(make_agent("random", space(), 3, {}))
    # A new agent (a resumed run) given the first 5 trials proposes the 6th.
    hist = [Seen(c, "ok", "", 1.0) for c in full[:5]]
    assert make_agent("random", space(), 3, {}).propose(hist, 1)[0] == full[5]


def test_agents_marked_pure_answer_the_same_history_the_same_way():
    """The loop asks a pure agent what it would propose next while a trial is judged, then
    asks again for real: the first question must change nothing (grid once kept a cursor)."""
    pure = [name for name, cls in STRATEGIES.items() if getattr(cls, "pure", False)]
    assert {"grid", "random", "pattern"} <= set(pure)
    for name in pure:
        a = make_agent(name, space(), 3, {})
        b = make_agent(name, space(), 3, {})
        hist = []
        for i in range(8):
            peek = a.propose(hist + [Seen({"A": 1, "B": "x", "C": True}, "ok", "", 2.0)], 1)  # a guess
            got = a.propose(hist, 1)
            assert got == b.propose(hist, 1), (name, i, peek)
            if not got:
                break
            hist.append(Seen(got[0], "ok", "", 1.0 + i % 3))
