"""Red team (helper, after session 65): a candidate that fails a faster rival in pipe compare by
writing one word of the rival's output guard band (the arena is mapped read-write in every host,
and the first-fit layout puts the rival's output block right before the candidate's). Since
session 65 compare's and the re-timing's snapshots check guard bands, so the rival is reported
wrong ("guard band changed") and the slower sabotaging candidate is the only kernel left.

HACK: honest (fast), slow (honest, 3 extra passes: a slower candidate), sab (slow + the write,
only in the compare/re-timing layout: inputs allocated before its output; evaluate's outputs are
allocated before its inputs)."""
from __future__ import annotations

import secrets
from pathlib import Path

from .conftest import JudgeBench, explain, module_bench, rmsnorm_hack_spec

TEMPLATE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>
namespace {
void rows(const float* x, const float* w, float* out, int64_t M, int64_t N, float eps) {
  for (int64_t r = 0; r < M; ++r) {
    const float* xr = x + r * N; float* o = out + r * N;
    float acc[8] = {}; int64_t i = 0;
    for (; i + 8 <= N; i += 8) for (int j = 0; j < 8; ++j) acc[j] += xr[i + j] * xr[i + j];
    float s = 0; for (int j = 0; j < 8; ++j) s += acc[j];
    for (; i < N; ++i) s += xr[i] * xr[i];
    const float sc = 1.0f / std::sqrt(s / (float)N + eps);
    for (int64_t k = 0; k < N; ++k) o[k] = xr[k] * sc * w[k];
  }
}
long fired = 0;
}
extern "C" void rmsnorm_cpu(const float* x, const float* w, float* out, int64_t M, int64_t N, float eps) {
{% if HACK != "honest" %}
  for (int rep = 0; rep < 3; ++rep) rows(x, w, out, M, N, eps);   // a slower kernel
{% endif %}
  rows(x, w, out, M, N, eps);
{% if HACK == "sab" %}
  uintptr_t X = (uintptr_t)x, Wp = (uintptr_t)w, O = (uintptr_t)out;
  auto blk = [](uintptr_t n) { return (n + 4095) / 4096 * 4096 + 4096; };
  uintptr_t rival_bytes = (M * N + 2 * 4096 + 128) * 4;     // an arm's buffer: bands, output, 512 B of room
  uintptr_t mine = (O - 4096 * 4) & ~(uintptr_t)4095;       // my buffer's block
  uintptr_t rival = mine - blk(rival_bytes);                // the block before mine
  (void)X;
  if (Wp % 4096 == 0 && Wp + blk(N * 4) == rival) {         // w's block, then another arm's, then mine
    uint32_t* last = (uint32_t*)(rival + rival_bytes - 4);  // the last word of its back guard band
    *last ^= 1u; ++fired;
    __builtin_printf("SAB fired=%ld\n", fired);
  }
{% endif %}
}
"""


class Bench(JudgeBench):
    def __init__(self, root: Path):
        super().__init__(root, "rms.cpp.j2", TEMPLATE, "spec.yaml",
                         rmsnorm_hack_spec("rt-sab", "compare sabotage", root / "rms.cpp.j2",
                                           ["honest", "slow", "sab"], ["normal"], 60, rep_ms=10))


bench = module_bench("rt-sab", Bench)


def sab_lines(bench):
    return [l for l in bench.log.read_text(errors="replace").splitlines() if "SAB" in l]


def compare(bench, first: str, second: str, rounds: int = 2):
    ts = {v: bench.run(v) for v in (first, second)}
    n = len(bench.spec.op.shapes)
    job = {"seed": secrets.randbits(48), "rounds": rounds, "eager": False, "compile": False, "arms": {},
           "copy": False,
           "candidates": [[{"label": v, "trial": 0, "artifact": bench.ev.artifacts[ts[v].key][i],
                            "geometry": bench.ev.builder.geometry(ts[v].params)[i]} for v in (first, second)]
                          for i in range(n)]}
    return bench.worker.request(("compare", job), 600)


def test_sab_is_ok_in_evaluate_and_fails_a_faster_rival_in_compare(bench):
    for v in ("honest", "slow", "sab"):
        t = bench.run(v)
        print(v, explain(t))
        assert t.status == "ok", explain(t)
    # (the host's printf does not reach worker.log here; the verdicts above are the evidence)
    # control: the slow honest candidate beside the fast honest one
    r = compare(bench, "honest", "slow")
    for si, s in enumerate(r["shapes"]):
        print("control", si, {k: (v["median"], v["error"]) for k, v in s.items()})
    r = compare(bench, "honest", "sab")
    for si, s in enumerate(r["shapes"]):
        print("attack", si, {k: (v["median"], v["error"]) for k, v in s.items()})
    print("\n".join(sab_lines(bench)[:4]), len(sab_lines(bench)))
    s0 = r["shapes"][0]  # shape 0: the arena's first blocks (x, w, the rival's, the candidate's)
    assert "guard band changed" in (s0["honest"]["error"] or ""), "the rival was not failed"
    assert s0["sab"]["error"] is None
