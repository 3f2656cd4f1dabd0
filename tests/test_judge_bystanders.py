"""Candidates timed side by side (pipe compare, a keep decision's re-timing) share one arena, and
since session 65 each one's verdict there checks its guard bands and scratch. A slower variant
that flipped a bit of a faster rival's band after its own calls made the rival, not itself, fail
"after timing" in pipe compare, and was the only kernel left (session 66's red team). The judge
now looks at every candidate's bands, scratch and secret sample positions after each candidate's
calls, charges any change to the candidate whose calls alone ran since the last look
(Judge._bystanders), and puts the victim's memory back; each candidate's first call in pipe
compare gets the value set itself, not what an earlier candidate's first call left there."""

from __future__ import annotations

import copy
import secrets
from pathlib import Path

from .conftest import JudgeBench, explain, module_bench, rmsnorm_hack_spec, second_writes_first

# HACK: honest; slow (honest, three passes more: slower); sab (slow, then one bit of the band
# of the candidate whose buffer comes just before its own in the arena: its own buffer's block
# is found from its output's pointer, the one before it from the size of a buffer of this shape,
# and it writes only where w's block comes right before that, as in pipe compare's layout on a
# worker's first requests, never in evaluate's, where the outputs come before the inputs); own
# (honest, and one element of its own front band written); stray (honest, and with sab's tell one
# word of the arena's free space written)
TEMPLATE = r"""
#include <cmath>
#include <cstdint>
namespace {
void rows(const float* x, const float* w, float* out, int64_t M, int64_t N, float eps) {
  for (int64_t r = 0; r < M; ++r) {
    const float* xr = x + r * N; float* o = out + r * N;
    float s = 0;
    for (int64_t i = 0; i < N; ++i) s += xr[i] * xr[i];
    const float sc = 1.0f / std::sqrt(s / (float)N + eps);
    for (int64_t k = 0; k < N; ++k) o[k] = xr[k] * sc * w[k];
  }
}
}
extern "C" void rmsnorm_cpu(const float* x, const float* w, float* out, int64_t M, int64_t N, float eps) {
{% if HACK != "honest" %}
  for (int rep = 0; rep < 3; ++rep) rows(x, w, out, M, N, eps);
{% endif %}
  rows(x, w, out, M, N, eps);
{% if HACK == "sab" %}
  uintptr_t Wp = (uintptr_t)w, O = (uintptr_t)out;
  auto blk = [](uintptr_t n) { return (n + 4095) / 4096 * 4096 + 4096; };
  uintptr_t rival_bytes = (M * N + 2 * 4096 + 128) * 4;
  uintptr_t mine = (O - 4096 * 4) & ~(uintptr_t)4095;
  uintptr_t rival = mine - blk(rival_bytes);
  if (Wp % 4096 == 0 && Wp + blk(N * 4) == rival) *(uint32_t*)(rival + rival_bytes - 4) ^= 1u;
{% endif %}
{% if HACK == "stray" %}
  {  // the same tell, then one word of the arena's free space, 1 GiB past its output
    uintptr_t Wp = (uintptr_t)w, O = (uintptr_t)out;
    auto blk = [](uintptr_t n) { return (n + 4095) / 4096 * 4096 + 4096; };
    uintptr_t mine = (O - 4096 * 4) & ~(uintptr_t)4095;
    uintptr_t rival = mine - blk((M * N + 2 * 4096 + 128) * 4);
    if (Wp % 4096 == 0 && Wp + blk(N * 4) == rival) *(volatile uint32_t*)((O + (1u << 30)) & ~(uintptr_t)4095) = 7u;
  }
{% endif %}
{% if HACK == "own" %}
  out[-1] = out[0];  // its own front band, always: wrong wherever it is judged
{% endif %}
}
"""


class Bench(JudgeBench):
    def __init__(self, root: Path):
        super().__init__(root, "rms.cpp.j2", TEMPLATE, "spec.yaml",
                         rmsnorm_hack_spec("bystanders", "a rival's memory", root / "rms.cpp.j2",
                                           ["honest", "slow", "sab", "own", "stray"], ["normal"], 60, rep_ms=10))


bench = module_bench("bystanders", Bench)


def _compare(bench, names: list[str], rounds: int = 2) -> dict:
    ts = {v: bench.run(v) for v in names}
    n = len(bench.spec.op.shapes)
    job = {"seed": secrets.randbits(48), "rounds": rounds, "eager": False, "compile": False, "arms": {},
           "copy": False,
           "candidates": [[{"label": v, "trial": 0, "artifact": bench.ev.artifacts[ts[v].key][i],
                            "geometry": bench.ev.builder.geometry(ts[v].params)[i]} for v in names]
                          for i in range(n)]}
    r = bench.worker.request(("compare", job), 600)
    assert r["status"] == "ok", r
    return r


def test_a_rivals_band_written_in_compare_is_charged_to_the_writer(bench):
    for v in ("honest", "slow", "sab"):
        t = bench.run(v)
        assert t.status == "ok", explain(t)  # evaluate's layout never fires the write
    control = _compare(bench, ["honest", "slow"])
    assert all(s[v]["error"] is None for s in control["shapes"] for v in ("honest", "slow")), control
    r = _compare(bench, ["honest", "sab"])
    # the faster rival is never the one charged; the writer is, where its write fired (the first
    # shape's blocks: x, w, the rival's buffer, its own)
    assert all(s["honest"]["error"] is None for s in r["shapes"]), r["shapes"]
    why = r["shapes"][0]["sab"]["error"] or ""
    assert "memory of another candidate" in why and "honest" in why and "guard band changed" in why, why


def test_a_write_to_the_arenas_free_space_in_compare_is_charged_once(bench):
    """The arena's free space written in pipe compare (session 66's review): the stray data stayed
    until the request's end, every later look found it again, and the whole request came back
    `wrong`, no candidate timed. It is charged to the calls after which it is found, and gone."""
    names = ["honest", "stray", "slow"]
    ts = {v: bench.run(v) for v in names}
    assert all(t.status == "ok" for t in ts.values()), {v: explain(t) for v, t in ts.items()}
    n = len(bench.spec.op.shapes)
    job = {"seed": secrets.randbits(48), "rounds": 2, "eager": False, "compile": False, "arms": {}, "copy": False,
           "candidates": [[{"label": v, "trial": 0, "artifact": bench.ev.artifacts[ts[v].key][i],
                            "geometry": bench.ev.builder.geometry(ts[v].params)[i]} for v in names]
                          for i in range(n)]}
    r = bench.worker.request(("compare", job), 600)
    assert r["status"] == "ok", r
    s0 = r["shapes"][0]
    assert "shared arena outside the buffers" in (s0["stray"]["error"] or ""), s0
    assert s0["honest"]["error"] is None and s0["slow"]["error"] is None, s0
    assert all(s[v]["median"] for s in r["shapes"] for v in ("honest", "slow"))


def test_the_retiming_charges_a_rivals_band_to_the_job_that_wrote_it(bench):
    """The re-timing on a real judge, with the second job's calls followed by a write to the
    first job's back band (from here, after each of its calls, as a kernel's last store would
    be): the second job is charged, the first never."""
    from runner.judge import worker

    judge = worker.Judge(bench.spec)
    second_writes_first(judge)
    t = bench.run("honest")
    arts = bench.ev.artifacts[t.key]
    geo = bench.ev.builder.geometry(t.params)
    try:
        r = judge.retime([{"artifacts": arts, "geometry": geo}, {"artifacts": arts, "geometry": geo}], 2, 7)
    finally:  # its kernel hosts end with the request, as a worker's do (a later test counts hosts)
        judge.rt.release()
    assert r["status"] == "wrong" and r["job"] == 1 and r.get("charged"), r
    assert "memory of another candidate" in r["reason"] and "job 0" in r["reason"], r


def test_an_incumbent_charged_in_the_retiming_leaves_the_challenger_ok_and_says_so(bench):
    """An incumbent charged with a write in a keep decision's re-timing (only its calls ran: its
    own band, or a challenger's memory): the challenger is neither wrong (a kept writer of its
    challengers' memory failed every one of them before) nor kept unpaired (a challenger that
    wrote what the incumbent reads would win so: session 66's review); the record names the
    incumbent. The incumbent here writes its own band, taken as kept as a writer that tells the
    re-timing apart would be."""
    inc = copy.deepcopy(bench.run("own"))
    assert inc.status == "wrong" and "guard band" in inc.reason, explain(inc)
    honest = bench.run("honest")
    inc.status, inc.reason, inc.times, inc.objective, inc.id = "ok", "", honest.times, honest.objective, 1
    bench.ev.artifacts[inc.key] = bench.ev._rebuild(inc)  # as if it had been kept
    t = copy.deepcopy(honest)
    assert t.status == "ok", explain(t)
    t.kept = False
    t.times = [x * 0.5 for x in inc.times]  # past the incumbent's bar, so the re-timing runs
    t.objective = inc.objective * 0.5
    bench.ev.decide(t, inc)
    rt = t.details.get("retime") or {}
    assert t.status == "ok", (rt, explain(t))
    assert t.kept is False and rt.get("incumbent_charged") == inc.id, rt
    assert "guard band changed" in rt.get("reason", ""), rt


def test_bystanders_charge_the_candidate_that_ran_and_put_the_memory_back(bench):
    """Judge._bystanders on a real judge's buffers, written from here: a change to another
    candidate's band, scratch or sample positions is the runner's; its own band is its own; the
    victim's memory is as it was after the look."""
    import torch

    from runner.judge.worker import Judge, _sample_positions
    from runner.judge.verify import scratch

    judge = Judge(bench.spec)
    judge.census = None
    shape = bench.spec.op.shapes[0]
    arms = {}
    for name in ("a", "b"):
        outs = judge._outputs(shape, decoy=True)
        ws = [scratch("acc", (64,), torch.float32, "cpu")]
        where = _sample_positions(outs, "cpu")
        arms[name] = (outs, ws, where, [p.clone() for p in where])
    assert judge._bystanders("a", arms) is None
    b_out = arms["b"][0][0]
    b_out.buf[b_out.front + b_out.numel + 3] += 1.0  # b's back band
    why = judge._bystanders("a", arms)
    assert why and "memory of another candidate" in why and "b:" in why and "guard band changed" in why, why
    assert b_out.guards_intact() and judge._bystanders("a", arms) is None  # put back: b is not charged later
    arms["b"][1][0].view[5] = 2.0  # b's scratch
    why = judge._bystanders("a", arms)
    assert why and "scratch 'acc'" in why and "b:" in why, why
    assert bool((arms["b"][1][0].view == 0).all())
    arms["b"][2][0][7] += 1  # b's secret positions
    why = judge._bystanders("a", arms)
    assert why and "sample positions" in why and "b:" in why, why
    assert torch.equal(arms["b"][2][0], arms["b"][3][0])
    # the value sets every call is refreshed from (on a GPU every kernel reaches them: session
    # 66's review framed a rival through them), under a keyed checksum: a swap of two elements,
    # which a plain sum keeps, is found too
    made = {"x": torch.randn(8, 4), "w": torch.rand(4)}
    sets = [{k: v.clone() for k, v in made.items()}]
    watch = [judge._watched(sets, lambda k: {n: v.clone() for n, v in made.items()}, reach=True)]
    assert judge._watched(sets, None) is None  # the CPU backend's kernels reach no judge's memory
    assert judge._bystanders("a", arms, watch) is None
    sets[0]["w"][1] = 7.0
    why = judge._bystanders("a", arms, watch)
    assert why and "the judge's own copy of input 'w'" in why, why
    assert torch.equal(sets[0]["w"], made["w"]) and judge._bystanders("a", arms, watch) is None  # made again
    sets[0]["x"][[0, 5]] = sets[0]["x"][[5, 0]]
    why = judge._bystanders("a", arms, watch)
    assert why and "input 'x'" in why, why
    a_out = arms["a"][0][0]
    a_out.buf[a_out.front - 1] -= 1.0  # a's own front band: a's own fault, not another's
    why = judge._bystanders("a", arms)
    assert why and why.startswith("output 'out': wrote outside its bounds") and "another" not in why, why
    assert judge._bystanders("b", arms) is None  # put back, so b's next look does not charge b


def test_the_keyed_checksum_sees_what_a_plain_sum_keeps():
    """Swapping two elements, or +d on one word and -d on another, keeps a plain sum of the
    words (session 66's review); the keyed sum moves, for every dtype a value set holds."""
    import torch

    from runner.judge.verify import keyed_sum

    key = (0x9E3779B97F4A7C15 >> 1 | 1, 12345)
    for t in (torch.randn(1000), torch.randn(999).bfloat16(), torch.randint(-9, 9, (501,), dtype=torch.int32),
              torch.rand(77) > 0.5, torch.randint(0, 255, (64,), dtype=torch.uint8)):
        base = keyed_sum(t, key)
        assert keyed_sum(t.clone(), key) == base
        u = t.clone()
        i, j = 3, 40
        if bool(u[i] == u[j]):
            j = next(k for k in range(len(u)) if bool(u[k] != u[i]))
        u[[i, j]] = u[[j, i]]
        assert keyed_sum(u, key) != base, t.dtype
        assert keyed_sum(u, (key[0] + 2, key[1])) != keyed_sum(u, key)  # the key matters
    w = torch.arange(16, dtype=torch.int64)
    v = w.clone()
    v[2] += 5
    v[9] -= 5
    assert int(v.sum()) == int(w.sum()) and keyed_sum(v, key) != keyed_sum(w, key)
