"""Kernels that tell the judge's calls from a user's calls of the exported op, and are right only
when judged (session 56's red team). The exported op gives a kernel outputs from torch.empty and
a user's tensors; the judge gave every output guard bands of one sentinel (-31337), every input
placed off the allocator's alignment a pad of zeros, never two equal rows in a value set, and let
a CUDA kernel read the clock and the device's size. Each tell's kernel is a variant of
rmsnorm.cpp.j2 (tests/data/*_tell.cpp.j2), 1% off wherever it finds a user's call."""

from __future__ import annotations

import json
import random

import pytest
import torch

from runner.build import ptx
from runner.judge.inputs import make_inputs
from runner.judge.verify import GUARD_POISON, placed, poisoned, scratch

from .conftest import PIPELINES, ROOT, pipe_main, shipped_spec

DATA = ROOT / "tests" / "data"


def test_guard_bands_hold_secret_values_not_a_sentinel():
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.uint8, torch.bool):
        a, b = poisoned((5, 9), dt, "cpu", 8), poisoned((5, 9), dt, "cpu", 8)
        band = torch.cat([a.buf[:a.front], a.buf[a.front + a.numel:]])
        if dt.is_floating_point:
            assert not bool((band == GUARD_POISON).any())
            assert not torch.equal(band, torch.cat([b.buf[:b.front], b.buf[b.front + b.numel:]]))
        assert a.guards_intact() and a.moved(a.buf.clone()).guards_intact() and not bool((band == 0).any())
        i = random.Random(1).choice([a.front - 1, a.front + a.numel])  # right before or right after
        a.buf[i] = ~a.buf[i] if dt == torch.bool else (a.buf[i] + 1 if dt.is_floating_point else a.buf[i] ^ 1)
        assert not a.guards_intact(), dt
    s = scratch("ws", (7,), torch.float32, "cpu")
    assert s.problem() is None and bool((s.view == 0).all())


def test_a_placed_input_is_preceded_by_its_own_values_not_zeros():
    t = torch.randn(7, 33)
    got = placed(t, 24)
    assert torch.equal(got, t) and got.storage_offset() == 24
    pad = got._base[:24]
    assert not bool((pad == 0).any()) and bool(torch.isin(pad, t.reshape(-1)).all())


def test_clock_and_device_registers_count_against_the_approved_build():
    body = "\tmov.u64 %rd1, %globaltimer;\n\tmov.u32 %r1, %nsmid;\n\tmov.u64 %rd2, %clock64;\n\tmov.u32 %r2, %gridid;\n"
    text = ".visible .entry k(\n.param .u64 p\n)\n{\n\t.reg .b64 %rd<3>;\n" + body + "\tret;\n}\n"
    a = ptx.analyze(text)
    assert a["data"] == {"%clocks and device registers": 4}
    action, why = ptx.compare(a, {"data": {}}, [])
    assert action == "device_state" and "globaltimer" in why
    assert ptx.compare(a, {"data": {"%clocks and device registers": 4}}, []) is None
    # in inline asm, and the lo/hi halves, too; a register merely named like one is not
    asm = "\t// begin inline asm\n\tmov.u32 %r1, %globaltimer_lo;\n\t// end inline asm\n\tmov.u32 %r2, %clockwise;\n"
    b = ptx.analyze(".visible .entry k()\n{\n" + asm + "\tret;\n}\n")
    assert b["data"].get("%clocks and device registers") == 1


def test_value_sets_repeat_rows_as_users_batches_do():
    op = shipped_spec(PIPELINES / "rmsnorm-range-cpu.yaml").op
    hits = sets = 0
    for seed in range(60):
        v = make_inputs(op, {"M": 64, "N": 256}, 77 + seed, 0, "cpu", structured=True)["x"]
        nz = v[v.abs().sum(1) != 0]
        sets += 1
        hits += nz.shape[0] > torch.unique(nz, dim=0).shape[0]
    assert hits > sets // 3  # a repeated nonzero row in about half the value sets at 64 rows (4 structured rows)
    timed = make_inputs(op, {"M": 64, "N": 256}, 5, 0, "cpu", timed=True)["x"]
    assert torch.unique(timed, dim=0).shape[0] == 64  # timed values are left as they were


@pytest.mark.parametrize("tell,spec", [("guard_tell", "rmsnorm-cpu"), ("pad_tell", "rmsnorm-range-cpu"),
                                       ("dup_tell", "rmsnorm-cpu")])
def test_a_kernel_right_only_where_it_sees_the_judge_is_wrong(project, tmp_path, tell, spec):
    """guard_tell: 1% off unless the elements before and after its output hold -31337; pad_tell: 1%
    off where x is off a 64-byte boundary and the 16 bytes before it are not all zero; dup_tell: 1%
    off on a nonzero row equal to the row before it. Each was `ok` before (and off on calls made as
    the exported op makes them: REPORT.md)."""
    r = pipe_main("eval", PIPELINES / f"{spec}.yaml", "--params", json.dumps({"ACC": 32, "UNROLL": 1, "THREADS": 1}),
                  "--variant", DATA / f"{tell}.cpp.j2", "--run-dir", tmp_path / tell, "--json", cwd=project)
    got = json.loads(r.stdout)
    assert got["status"] == "wrong", (r.stdout + r.stderr)[-2000:]
