"""The first check run of every round finds the kernel's own outputs for another value set in its
buffers (worker.Judge._primed, then the round before's), as every timed call after the first finds
its own answer to the call before. Otherwise a kernel can hide a mark in its own outputs (here the
XOR of the low 4 bits of out[0..15] and of out[16..31], set by moving the largest of each 16 by a
few units), find it only in timed calls (a reference decoy carries it 1 time in 256), and take a
shortcut there alone: m01 reads subnormal inputs as 0 where it finds its mark, which no timed
value of rmsnorm-cpu holds, and was `ok` in every run before (datasets/judge-redteam/s49-mark)."""
from __future__ import annotations

import json

import pytest

from .conftest import PIPELINES, ROOT, pipe_main

SERIAL = pytest.mark.xdist_group("tests.test_judge_cpu")
MARK = ROOT / "datasets" / "judge-redteam" / "s49-mark"
PARAMS = {"ACC": 8, "THREADS": 1, "UNROLL": 2}


@SERIAL
@pytest.mark.parametrize("variant, verdict", [("m00_mark_only", "ok"), ("m01_daz_when_own_mark", "wrong")])
def test_a_kernel_that_finds_its_own_mark_is_verified_where_it_does(tmp_path, project, variant, verdict):
    r = pipe_main("eval", PIPELINES / "rmsnorm-cpu.yaml", "--params", json.dumps(PARAMS),
                  "--variant", MARK / f"{variant}.cpp.j2", "--run-dir", tmp_path / variant, "--json", cwd=project)
    got = json.loads(r.stdout)
    # (m00, the mark alone, is `ok`: m01 is `wrong` by the subnormal inputs it read as 0)
    assert got["status"] == verdict, r.stdout[-3000:] + r.stderr[-2000:]
