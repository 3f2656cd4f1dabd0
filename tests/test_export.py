"""pipe export: the dispatch table's decisions, the package it writes (from real H200
runs kept in tests/data), and the exported ops: fallback, input checks, torch.library
registration, torch.compile(fullgraph=True); on a GPU also the shipped kernels, CUDA
graph capture and held-out shapes."""

import json
import subprocess
import sys
import textwrap

import pytest

from runner.ship.export import NOISE, baked_symbols, dispatch_table, launch_table
from runner.core.records import Trial

from .conftest import H200_RUNS, PIPELINES, ROOT, frozen_spec, pipe_main, shipped_spec

RUNS = H200_RUNS


def test_baked_symbols_are_the_sizes_compiled_into_the_kernel():
    assert baked_symbols(shipped_spec(PIPELINES / "softmax-h200.yaml")) == ["N"]
    assert baked_symbols(shipped_spec(PIPELINES / "rmsnorm-h200.yaml")) == ["N"]
    assert baked_symbols(shipped_spec(PIPELINES / "cross-entropy-h200.yaml")) == ["V"]


def _cmp(tuned_s, eager_s, error=None):
    return {"tuned": {"trial": 1, "params": {"A": 1}, "time_s": tuned_s} if tuned_s else None,
            "arms": {"torch eager": {"time_s": eager_s, "error": error}}}


def test_dispatch_uses_a_kernel_only_where_it_beats_eager_beyond_noise():
    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")  # four shapes
    hist = [Trial(params={"A": 1}, status="ok", agent="x", times=[1e-4] * 4, id=1, kept=True)]
    compare = {"shapes": [_cmp(100e-6, 200e-6), _cmp(100e-6, 100e-6 * (1 + NOISE / 2)),
                          _cmp(None, 200e-6), _cmp(100e-6, 200e-6, error="wrong")]}
    rows = dispatch_table(spec, hist, compare, baseline=[300e-6, 300e-6, 300e-6, 300e-6])
    assert [r["use"] for r in rows] == ["kernel", "fallback", "fallback", "fallback"]
    assert rows[0]["baseline_s"] == 200e-6  # the smaller eager figure
    assert "within" in rows[1]["why"] and "no correct tuned kernel" in rows[2]["why"]
    # no pipe compare: the ledger's per-shape best against the recorded baseline, with a wider margin
    rows = dispatch_table(spec, hist, None, baseline=[2e-4, 1.02e-4, 2e-4, 2e-4])
    assert [r["use"] for r in rows] == ["kernel", "fallback", "kernel", "kernel"]
    assert rows[0]["evidence"].startswith("ledger")


def test_packages_ship_tables_cubins_and_sources(exported):
    for pkg in ("softmax_h200", "rmsnorm_h200", "cross_entropy_h200"):
        d = exported / pkg
        table = json.loads((d / "table.json").read_text())
        assert table["format"] == "pipe-dispatch/1" and table["arch"] == "sm_90"
        kernels = [e for e in table["entries"] if e["use"] == "kernel"]
        assert kernels, table["entries"]
        for e in kernels:
            blob = (d / e["cubin"]).read_bytes()
            assert blob[:4] == b"\x7fELF"
            assert table["entry"] in (d / e["cubin"]).with_suffix(".cu").read_text()
        assert (d / "_runtime.py").is_file() and (d / "_reference.py").is_file()


def _py(exported, code, timeout=600):
    """Run code in a fresh interpreter with only the exported packages on the path (no pipe needed)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=exported, capture_output=True, text=True,
                       timeout=timeout, env={"PYTHONPATH": str(exported), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout


def test_three_exported_ops_side_by_side_on_cpu_fall_back_and_check_inputs(exported):
    out = _py(exported, """
        import sys, torch
        import softmax_h200 as sm, rmsnorm_h200 as rn, cross_entropy_h200 as ce
        assert "runner" not in sys.modules  # the packages stand alone
        torch.manual_seed(0)
        x = torch.randn(6, 4096).bfloat16()
        w = (torch.rand(4096) + 0.5).bfloat16()
        y = sm.softmax(x)
        assert torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=1e-2, rtol=1.6e-2)
        z = rn.rmsnorm(x, w, 1e-6)
        ref = torch.nn.functional.rms_norm(x.float(), (4096,), w.float(), 1e-6)
        assert torch.allclose(z.float(), ref, atol=2e-2, rtol=2e-2)
        t = torch.randint(0, 4096, (6,)); t[0] = -100
        l = ce.cross_entropy(x, t, -100)
        assert l.dtype == torch.float32 and l[0] == 0
        assert torch.allclose(l, torch.nn.functional.cross_entropy(x.float(), t, ignore_index=-100, reduction="none"), atol=1e-3)
        assert sm.op.calls == {"kernel": 0, "fallback": 1}  # CPU tensors: the torch reference
        # the kernels were verified at the spec's scalars alone: any other value takes the fallback
        assert rn.op.verified_scalars({"eps": 1e-6}) and not rn.op.verified_scalars({"eps": 1e-5})
        assert ce.op.verified_scalars({"ignore_index": -100})
        assert not ce.op.verified_scalars({"ignore_index": -1})
        assert not ce.op.verified_scalars({"ignore_index": 2 ** 40})
        for bad, want in ((lambda: sm.softmax(x.float()), "'x' must be bf16"),
                          (lambda: sm.softmax(x[0]), "must have 2 dimensions"),
                          (lambda: rn.rmsnorm(x, w[:100], 1e-6), "'w' must have shape [N]"),
                          (lambda: ce.cross_entropy(x, t.int(), -100), "'targets' must be int64")):
            try:
                bad()
                raise SystemExit("accepted a bad input")
            except ValueError as e:  # each package has its own InputError, a ValueError
                assert want in str(e), str(e)
        f = torch.compile(lambda a, b: sm.softmax(a) + rn.rmsnorm(a, b, 1e-6), fullgraph=True)
        assert torch.allclose(f(x, w).float(), (y.float() + z.float()), atol=3e-2)
        print(torch.ops.pipe_softmax_h200.softmax(x).shape, torch.ops.pipe_cross_entropy_h200.cross_entropy(x, t, -100).shape)
    """)
    assert "torch.Size([6, 4096]) torch.Size([6])" in out


def test_a_package_checks_a_share_of_its_kernels_calls_against_the_float64_reference(exported):
    """A kernel right on every value set the judge drew but wrong on a user's (a tell the judge's
    draws never meet) is found in use: the package carries the judge's budgets (_verify.py) and the
    spec's tolerance (table.json `check`), and checks a share of the kernel's calls (set_check, or
    PIPE_CHECK at import). Here on the CPU, against outputs made to be right and wrong: a correctly
    rounded answer passes; 1% off (inside bf16's element budget, outside its lean), a NaN, or a loss
    2e-3 off fail; a failure takes the kernel out of dispatch and answers the reference's values
    (`fallback`), raises (`raise`) or passes the output on (`warn`). The GPU test runs the real
    kernels under the check."""
    out = _py(exported, """
        import sys, warnings, torch
        import softmax_h200 as sm, rmsnorm_h200 as rn, cross_entropy_h200 as ce
        assert "runner" not in sys.modules  # the check runs on what the package ships
        assert sm.table["check"] == {"atol": 1e-3, "rtol": 1.6e-2, "ulps": 1.0, "floor": 2.0 ** -7, "gemm_k": None,
                                     "in_place": False}
        torch.manual_seed(0)
        x = torch.randn(64, 4096).bfloat16()
        ref = torch.softmax(x.double(), -1)
        assert sm.op.check_call({"x": x}, {}, [ref.bfloat16()]) is None
        why = sm.op.check_call({"x": x}, {}, [(ref * 1.01).bfloat16()])
        assert why is not None and "output 'y'" in why and "lean" in why, why
        bad = ref.bfloat16(); bad[5, 7] = float("nan")
        assert "NaN" in sm.op.check_call({"x": x}, {}, [bad])
        w = (torch.rand(4096) + 0.5).bfloat16()
        z = torch.nn.functional.rms_norm(x.double(), (4096,), w.double(), 1e-6)
        assert rn.op.check_call({"x": x, "w": w}, {"eps": 1e-6}, [z.bfloat16()]) is None
        assert rn.op.check_call({"x": x, "w": w}, {"eps": 1e-6}, [(z * 0.99).bfloat16()]) is not None
        lg = torch.randn(64, 32000).bfloat16()
        t = torch.randint(0, 32000, (64,)); t[::7] = -100
        loss = torch.nn.functional.cross_entropy(lg.double(), t, ignore_index=-100, reduction="none").float()
        assert ce.op.check_call({"logits": lg, "targets": t}, {"ignore_index": -100}, [loss]) is None
        assert ce.op.check_call({"logits": lg, "targets": t}, {"ignore_index": -100}, [loss + 2e-3]) is not None
        # the reference is of the inputs as they were before the launch, and a changed input fails
        zeroed = torch.zeros_like(x)
        assert sm.op.check_call({"x": zeroed}, {}, [torch.softmax(zeroed.double(), -1).bfloat16()], before={"x": x}) \
            == "input 'x' was changed by the kernel"
        assert sm.op.check_call({"x": x}, {}, [ref.bfloat16()], before={"x": x.clone()}) is None
        # a reference that is not finite on the user's data judges nothing (torch's own answer there)
        masked = x.clone(); masked[3] = float("-inf")
        try:
            sm.op.check_call({"x": masked}, {}, [torch.softmax(masked, -1)])
            raise SystemExit("judged a call whose reference is NaN")
        except sm._runtime.Unjudged:
            pass
        # what a failed check does: the kernel leaves dispatch, the call gets the reference's answer
        e = next(e for e in sm.table["entries"] if e["use"] == "kernel")
        env = {"M": 64, "N": 4096}
        sm.set_check(1.0)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            outs = sm.op._checked(e, env, {"x": x}, {}, [(ref * 1.01).bfloat16()])
        assert any("failed a check of a user's call" in str(g.message) and e["cubin"] in str(g.message) for g in got)
        assert torch.equal(outs[0], torch.softmax(x, -1))  # the fallback's answer: the torch reference
        assert sm.checks()["checked"] == 1 and sm.checks()["failed"] == 1 and sm.op._key(e) in sm.op._disabled
        assert sm.op._checked(e, env, {"x": x}, {}, [ref.bfloat16()])[0] is not None and sm.checks()["failed"] == 1
        sm.set_check(0.5, "raise")
        try:
            sm.op._checked(e, env, {"x": x}, {}, [bad])
            raise SystemExit("a failed check did not raise")
        except sm.KernelCheckError as err:
            assert "NaN" in str(err)
        sm.set_check(1.0, "warn")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            kept = sm.op._checked(e, env, {"x": x}, {}, [bad])[0]
        assert torch.isnan(kept).any()  # passed on as the kernel gave it
        # a check with no verdict leaves the call as the kernel answered it, the kernel in dispatch
        sm.set_check(1.0)
        sm.op._disabled.clear()
        before = dict(sm.checks())
        passed = torch.softmax(masked, -1)
        got = sm.op._checked(e, env, {"x": masked}, {}, [passed])
        assert got[0] is passed and sm.op._key(e) not in sm.op._disabled
        assert sm.checks()["unjudged"] == before["unjudged"] + 1 and sm.checks()["failed"] == before["failed"]
        for share, action in ((1.5, "fallback"), (0.1, "retry"), (True, "warn")):
            try:
                sm.set_check(share, action)
                raise SystemExit("accepted a bad check setting")
            except ValueError as err:
                assert "share" in str(err) or "action" in str(err), str(err)
        print("checked")
    """)
    assert "checked" in out
    # PIPE_CHECK and PIPE_CHECK_ACTION at import: read, and a malformed value is an error naming the variable
    from runner.ship import exported_runtime as rt

    for env, want in (({"PIPE_CHECK": "0.25"}, (0.25, "fallback")), ({"PIPE_CHECK": "1", "PIPE_CHECK_ACTION": "Raise"},
                                                                     (1.0, "raise")), ({}, (0.0, "fallback"))):
        with pytest.MonkeyPatch.context() as mp:
            for k in ("PIPE_CHECK", "PIPE_CHECK_ACTION"):
                mp.delenv(k, raising=False)
            for k, v in env.items():
                mp.setenv(k, v)
            assert rt._env_check() == want
    for env, want in (({"PIPE_CHECK": "half"}, "PIPE_CHECK='half'"), ({"PIPE_CHECK": "2"}, "PIPE_CHECK='2'"),
                      ({"PIPE_CHECK": "0.1", "PIPE_CHECK_ACTION": "log"}, "PIPE_CHECK_ACTION='log'")):
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            with pytest.raises(ValueError, match=want):
                rt._env_check()


def test_a_package_whose_cubin_changed_after_its_export_is_refused_at_import(exported, tmp_path):
    """Every shipped cubin's sha256 is in table.json: a copy of a package with one byte of a
    kernel changed fails to import with an error naming the file; a cubin the export did not
    write, or one whose digest was taken out of the table, fails the same check (Op.check_files,
    which the package's register runs); the intact package passes it."""
    import hashlib
    import shutil

    from runner.ship import exported_runtime as rt

    table = json.loads((exported / "softmax_h200" / "table.json").read_text())
    named = {e["cubin"] for e in table["entries"] if e.get("cubin")}
    assert named and set(table["digests"]) == named
    assert all(hashlib.sha256((exported / "softmax_h200" / n).read_bytes()).hexdigest() == d
               for n, d in table["digests"].items())
    victim = sorted(named)[0]
    assert rt.Op(exported / "softmax_h200", table, None).check_files() == len(named)
    for case in ("flipped", "added", "dropped"):
        d = tmp_path / case / "softmax_h200"
        shutil.copytree(exported / "softmax_h200", d)
        t = json.loads((d / "table.json").read_text())
        if case == "flipped":
            blob = bytearray((d / victim).read_bytes())
            blob[len(blob) // 2] ^= 1
            (d / victim).write_bytes(bytes(blob))
        elif case == "added":
            shutil.copyfile(d / victim, d / "kernels" / "extra.cubin")
        else:
            del t["digests"][victim]
        with pytest.raises(RuntimeError, match="is not the kernel pipe export shipped") as e:
            rt.Op(d, t, None).check_files()
        assert ("extra.cubin" if case == "added" else victim) in str(e.value), (case, str(e.value))
    # the package itself, imported as a user would: refused
    r = subprocess.run([sys.executable, "-c", "import softmax_h200"], cwd=tmp_path / "flipped", capture_output=True,
                       text=True, timeout=300, env={"PYTHONPATH": str(tmp_path / "flipped"), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and victim in r.stderr and "is not the kernel pipe export shipped" in r.stderr, \
        r.stderr[-2000:]


def test_export_refuses_a_changed_spec(tmp_path):
    import shutil

    proj = tmp_path / "proj"  # the spec, template and profile the run was made with, then one edit
    shutil.copytree(RUNS["softmax"] / "project", proj)
    spec = proj / "pipelines" / "softmax-h200.yaml"
    spec.write_text(spec.read_text().replace("warmup_ms: 10", "warmup_ms: 11"))
    run = tmp_path / "run"
    shutil.copytree(RUNS["softmax"], run)
    r = pipe_main("export", run, "--out", tmp_path / "o", "--spec", spec, cwd=proj)
    assert r.returncode == 2 and "changed since the run" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.gpu
def test_exported_kernels_on_the_gpu(exported):
    """Tuned sizes with other row counts take the shipped kernel and match torch; a
    held-out row length falls back; CUDA graph capture and replay; torch.compile. Every kernel
    call outside a capture is checked against the float64 reference (set_check), and none fails."""
    _py(exported, """
        import torch
        import softmax_h200 as sm, rmsnorm_h200 as rn, cross_entropy_h200 as ce
        for m in (sm, rn, ce):
            m.set_check(1.0, "raise")
        torch.manual_seed(0)
        for n in (4096, 16384, 32768, 131072):
            x = torch.randn(77, n, device="cuda").bfloat16()
            y = sm.softmax(x)
            assert torch.allclose(y.float(), torch.softmax(x.double(), -1).float(), atol=1e-3, rtol=1.6e-2), n
        assert sm.op.calls["kernel"] == 4 and sm.op.calls["fallback"] == 0
        held = torch.randn(5, 2048, device="cuda").bfloat16()  # a row length nobody tuned: the reference
        assert torch.allclose(sm.softmax(held).float(), torch.softmax(held.float(), -1), atol=1e-2)
        assert sm.op.calls["fallback"] == 1
        w = (torch.rand(8192, device="cuda") + 0.5).bfloat16()
        x = torch.randn(300, 8192, device="cuda").bfloat16()
        z = rn.rmsnorm(x, w, 1e-6)
        ref = torch.nn.functional.rms_norm(x.double(), (8192,), w.double(), 1e-6)
        assert torch.allclose(z.double(), ref, atol=1e-2, rtol=1.6e-2) and rn.op.calls["kernel"] == 1
        # another eps than the one verified: the fallback, and torch's answer at that eps
        z = rn.rmsnorm(x, w, 1e-5)
        ref = torch.nn.functional.rms_norm(x.double(), (8192,), w.double(), 1e-5)
        assert torch.allclose(z.double(), ref, atol=1e-2, rtol=1.6e-2) and rn.op.calls == {"kernel": 1, "fallback": 1}
        lg = torch.randn(64, 32000, device="cuda").bfloat16()
        t = torch.randint(0, 32000, (64,), device="cuda"); t[::7] = -100
        l = ce.cross_entropy(lg, t, -100)
        ref = torch.nn.functional.cross_entropy(lg.double(), t, ignore_index=-100, reduction="none")
        assert torch.allclose(l.double(), ref, atol=1e-3, rtol=2e-4) and ce.op.calls["kernel"] == 1
        # CUDA graphs: capture, then replay on new values in the same buffers
        x = torch.randn(128, 4096, device="cuda").bfloat16()
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            sm.softmax(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = sm.softmax(x)
        x.copy_(torch.randn(128, 4096, device="cuda").bfloat16())
        g.replay(); torch.cuda.synchronize()
        assert torch.allclose(out.float(), torch.softmax(x.float(), -1), atol=1e-3, rtol=1.6e-2)
        f = torch.compile(lambda a: sm.softmax(a) * 2, fullgraph=True)
        assert torch.allclose(f(x).float(), 2 * torch.softmax(x.float(), -1), atol=3e-3, rtol=1.6e-2)
        # every kernel call but the captured one was checked, and passed
        assert sm.checks()["checked"] == sm.op.calls["kernel"] - 1 >= 5 and sm.checks()["failed"] == 0, sm.checks()
        assert rn.checks() == {"checked": 1, "failed": 0, "unjudged": 0, "last": None} and ce.checks()["checked"] == 1
        print("ok")
    """)


def test_choose_takes_the_same_compiled_sizes_and_the_nearest_free_ones():
    from runner.ship.export import choose

    entries = [{"key": [4096], "shape": {"M": 32768, "N": 4096}, "use": "kernel", "trial": 1},
               {"key": [4096], "shape": {"M": 64, "N": 4096}, "use": "fallback", "trial": None},
               {"key": [8192], "shape": {"M": 16384, "N": 8192}, "use": "kernel", "trial": 2}]
    assert choose(entries, ["N"], ["M", "N"], {"M": 20000, "N": 4096})["trial"] == 1
    assert choose(entries, ["N"], ["M", "N"], {"M": 100, "N": 4096})["use"] == "fallback"
    assert choose(entries, ["N"], ["M", "N"], {"M": 7, "N": 8192})["trial"] == 2
    assert choose(entries, ["N"], ["M", "N"], {"M": 7, "N": 2048}) is None


def test_nearest_tuned_sizes_ship_only_where_pipe_compare_timed_them_faster_than_eager():
    from runner.ship.export import held_out_entries, nearest

    entries = [{"key": [4096], "shape": {"M": 32768, "N": 4096}, "use": "kernel", "trial": 1},
               {"key": [32768], "shape": {"M": 4096, "N": 32768}, "use": "kernel", "trial": 3},
               {"key": [16384], "shape": {"M": 8192, "N": 16384}, "use": "fallback", "trial": None}]
    # nearest in the compiled-in size first (8192 is nearer 4096 than 32768 on a log scale;
    # 12288 nearer 16384, whose entry is a fallback and so no candidate, then 4096 against 32768)
    assert nearest(entries, ["N"], ["M", "N"], {"M": 16384, "N": 8192})["trial"] == 1
    assert nearest(entries, ["N"], ["M", "N"], {"M": 100, "N": 24576})["trial"] == 3
    assert nearest([e for e in entries if e["use"] != "kernel"], ["N"], ["M", "N"], {"M": 1, "N": 8}) is None
    # 65536 rows are as near 32768 as 131072 (log scale), and 2048 rows as near 4096 as 1024:
    # both are candidates, one per trial, and pipe compare takes the faster there
    from runner.ship.export import nearest_all

    both = entries + [{"key": [131072], "shape": {"M": 1024, "N": 131072}, "use": "kernel", "trial": 4},
                      {"key": [131072], "shape": {"M": 512, "N": 131072}, "use": "kernel", "trial": 4}]
    assert [e["trial"] for e in nearest_all(both, ["N"], ["M", "N"], {"M": 2048, "N": 65536})] == [3, 4]
    assert [e["trial"] for e in nearest_all(both, ["N"], ["M", "N"], {"M": 4096, "N": 65536})] == [3]  # M decides
    assert nearest_all([], ["N"], ["M", "N"], {"M": 1, "N": 8}) == []
    compare = {"held_out": [
        {"shape": {"M": 16384, "N": 8192}, "choice": "#1", "via": "nearest tuned sizes (32768x4096), checked here",
         "ship": {"trial": 1, "params": {"EPT": 8}, "variant": None, "time_s": 1e-4, "baseline_s": 5e-4}},
        {"shape": {"M": 2048, "N": 65536}, "choice": "torch eager", "via": "no tuned sizes; nearest #3 not faster here"},
        {"shape": {"M": 65536, "N": 4096}, "choice": "#1", "via": "tuned sizes"}]}
    rows = held_out_entries(compare, ["N"])
    assert [r["key"] for r in rows] == [[8192]] and rows[0]["use"] == "kernel" and rows[0]["params"] == {"EPT": 8}
    from runner.ship.export import choose

    table = entries + rows
    assert choose(table, ["N"], ["M", "N"], {"M": 100, "N": 8192})["trial"] == 1  # shipped, compiled for 8192
    assert choose(table, ["N"], ["M", "N"], {"M": 100, "N": 65536}) is None  # eager was as fast: fallback
    assert held_out_entries(None, ["N"]) == [] and held_out_entries({"shapes": []}, ["N"]) == []


@pytest.mark.parametrize("name", ["softmax-h200", "rmsnorm-h200", "cross-entropy-h200"])
def test_exported_launch_geometry_is_the_runners_on_every_configuration_and_shape(name):
    """The exported runtime evaluates the spec's geometry itself (no pipe at import): on every
    configuration and shape, tuned and held-out, it must launch exactly what the runner
    judged: grid, block, cluster and dynamic shared memory (the ring holds)."""
    from runner.ship.exported_runtime import Op
    from runner.build.builder import Builder

    spec = shipped_spec(PIPELINES / f"{name}.yaml")
    ev = Builder(spec)
    table = {**launch_table(spec), "inputs": [], "outputs": [], "scalars": [], "symbols": [], "baked": [],
             "entries": []}
    op = Op(ROOT, table, None)
    shapes = spec.op.all_shapes + spec.op.held_out_shapes
    smem = 0
    for cfg in spec.space:
        for shape, g in zip(shapes, ev.geometry(cfg, shapes=shapes)):
            mine = op.geometry({"params": cfg}, shape)
            assert mine == {"grid": list(g["grid"]), "block": list(g["block"]), "cluster": list(g.get("cluster") or []),
                            "shared_mem": int(g.get("shared_mem") or 0)}, (cfg, shape)
            smem = max(smem, mine["shared_mem"])
    assert (smem > 48 * 1024) == (name != "cross-entropy-h200")  # the ring holds of softmax and RMSNorm


def test_a_compare_json_shipping_two_kernels_for_one_size_is_refused():
    from runner.ship.export import ExportError, held_out_entries

    ship = {"params": {}, "variant": None, "time_s": 1e-4, "baseline_s": 5e-4}
    same = {"held_out": [{"shape": {"M": 1, "N": 8192}, "ship": {**ship, "trial": 1}},
                         {"shape": {"M": 9, "N": 8192}, "ship": {**ship, "trial": 1}}]}
    assert len(held_out_entries(same, ["N"])) == 1  # one entry serves every number of rows
    two = {"held_out": [{"shape": {"M": 1, "N": 8192}, "ship": {**ship, "trial": 1}},
                        {"shape": {"M": 9, "N": 8192}, "ship": {**ship, "trial": 2}}]}
    with pytest.raises(ExportError, match="same compiled-in sizes"):
        held_out_entries(two, ["N"])


@pytest.mark.gpu
def test_exported_runtime_launches_the_tma_ring_with_dynamic_shared_memory(tmp_path):
    """The exported runtime on softmax "tma" kernels: 192 KiB of dynamic shared memory (allowed
    on the launching device once per kernel, then reused) and a cluster of 2 for rows of
    131072, on masked inputs; outputs match torch."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import hashlib
    import shutil

    from runner.ship.exported_runtime import Op
    from runner.build.builder import Builder

    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")
    ev = Builder(spec)
    cfg = {"EPT": 64, "TMAX": 512, "MINB": 1, "VEC": 8, "HOLD": "tma", "LOAD": "default", "STORE": "default"}
    shapes = [{"M": 256, "N": 32768}, {"M": 100, "N": 131072}, {"M": 7, "N": 4096}]
    entries = []
    for i, (src, geo) in enumerate(zip(ev.render_all(cfg, shapes=shapes), ev.geometry(cfg, shapes=shapes))):
        b = ev.build([src], [geo])
        assert b.status == "ok", b.reason
        shutil.copyfile(b.artifacts[0], tmp_path / f"k{i}.cubin")
        entries.append({"key": [shapes[i]["N"]], "shape": shapes[i], "use": "kernel", "trial": i + 1,
                        "params": cfg, "cubin": f"k{i}.cubin"})
    table = {**launch_table(spec), "op": "test.softmax", "entry": spec.kernel.entry, "args": list(spec.kernel.args),
             "inputs": [{"name": "x", "dtype": "bf16", "shape": ["M", "N"]}],
             "outputs": [{"name": "y", "dtype": "bf16", "shape": ["M", "N"]}], "scalars": [],
             "symbols": ["M", "N"], "baked": ["N"], "entries": entries,
             "digests": {e["cubin"]: hashlib.sha256((tmp_path / e["cubin"]).read_bytes()).hexdigest() for e in entries}}
    op = Op(tmp_path, table, lambda x: torch.softmax(x, -1))
    geos = [op.geometry(e, e["shape"]) for e in entries]
    assert geos[0]["shared_mem"] > 48 * 1024 and geos[1]["cluster"] == [2]
    for shape in (*shapes, shapes[0]):  # the first kernel again: its allowance is kept
        x = torch.randn(shape["M"], shape["N"], device="cuda").bfloat16()
        x[:, 5:: 4] = float("-inf")  # masked, as in attention
        y = op(x)
        torch.cuda.synchronize()
        assert torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=1e-3, rtol=1.6e-2), shape
    assert op.calls == {"kernel": 4, "fallback": 0}
    # a contiguous view 2 bytes into its storage, at a size a kernel serves: the kernels' 16-byte
    # accesses would misread it (the judge only ever hands them torch's aligned buffers), so the
    # op takes the fallback
    x = torch.randn(1 + 7 * 4096, device="cuda").bfloat16()[1:].view(7, 4096)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    y = op(x)
    torch.cuda.synchronize()
    assert torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=1e-3, rtol=1.6e-2)
    assert op.calls == {"kernel": 4, "fallback": 1}


def test_launch_geometry_in_blocks_becomes_cuda_cores_grid_in_clusters():
    """One conversion for the runner and the exported runtime (no GPU needed to check it)."""
    from runner.ship.exported_runtime import in_clusters

    assert in_clusters([264], [512], [2]) == ((132,), (512,), (2,))
    assert in_clusters((132,), (1024,), ()) == ((132,), (1024,), None)
    assert in_clusters([40], [256], [1]) == ((40,), (256,), None)
    assert in_clusters(None, None, None) == ((1,), (1,), None)
    assert in_clusters([64, 3], [128], [8]) == ((8, 3), (128,), (8, 1))
    with pytest.raises(ValueError, match="not a whole number of clusters"):
        in_clusters([10], [256], [4])


def test_a_call_of_2_31_elements_or_more_takes_the_fallback():
    """The judge never verifies shapes that large, so a kernel indexing with 32-bit integers (an
    honest slip or a cheat: session 54's red team had one `ok`) is never seen wrong there: the
    exported op serves such calls by its fallback (meta tensors: no memory)."""
    import torch

    from runner.ship.exported_runtime import INDEX_LIMIT, Op as Exported

    assert INDEX_LIMIT == 2 ** 31
    below = torch.empty((INDEX_LIMIT // 4096 - 1, 4096), device="meta")
    at = torch.empty((INDEX_LIMIT // 4096, 4096), device="meta")
    assert Exported.verified_width([below], [list(below.shape)])
    assert not Exported.verified_width([at], [list(below.shape)])
    assert not Exported.verified_width([below], [[INDEX_LIMIT // 4096, 4096]])  # an output that large
    assert not Exported.verified_width([below, at], [])


def test_a_cluster_past_the_portable_size_opts_its_kernel_in_once(monkeypatch):
    """raise_smem (the runner's and the exported runtime's one launch preparation) sets the
    kernel's non-portable cluster attribute for a cluster of more than 8 blocks, once a kernel,
    and never for a portable one (the attribute itself is set on the GPU: range_check's CL 16)."""
    from runner.ship import exported_runtime as rt

    calls = []
    monkeypatch.setattr(rt, "allow_dynamic_smem", lambda k, n, d: calls.append(("smem", k, n)))
    monkeypatch.setattr(rt, "allow_large_clusters", lambda k, d: calls.append(("cluster", k)))
    allowed: dict = {}
    rt.raise_smem("k8", 98304, 0, allowed, "k8", [8])
    rt.raise_smem("k8", 98304, 0, allowed, "k8", (8,))
    assert calls == [("smem", "k8", 98304)]
    rt.raise_smem("k16", 98304, 0, allowed, "k16", [16])
    rt.raise_smem("k16", 65536, 0, allowed, "k16", [16])
    rt.raise_smem("k16", 131072, 0, allowed, "k16", [16, 1])
    assert calls[1:] == [("smem", "k16", 98304), ("cluster", "k16"), ("smem", "k16", 131072)]
    rt.raise_smem("k2d", 0, 0, allowed, "k2d", [4, 4])  # 16 blocks in two dimensions
    rt.raise_smem("kn", 0, 0, allowed, "kn", None)
    assert calls[4:] == [("cluster", "k2d")]


def test_an_exact_run_verified_at_another_scalar_value_is_not_the_same_op(tmp_path):
    """pipe export --exact joins a run's kernels to the main table, whose scalars keep one value
    each and whose kernels run at it alone: a run verified at eps 1e-5 is not the op of a table
    at 1e-6 (before session 49 the scalars were compared by name and type only)."""
    from runner.ship.export import same_op
    from runner.spec.spec import load_spec

    base = PIPELINES / "rmsnorm-h200.yaml"
    other = tmp_path / "rmsnorm-h200.yaml"
    other.write_text(base.read_text().replace("eps: {value: 1.0e-6, type: f32}", "eps: {value: 1.0e-5, type: f32}"))
    assert other.read_text() != base.read_text()
    same = tmp_path / "same.yaml"
    same.write_text(base.read_text())
    assert same_op(load_spec(same)) == same_op(load_spec(base))
    assert same_op(load_spec(other)) != same_op(load_spec(base))


def test_a_compare_json_naming_a_kernel_the_ledger_does_not_hold_is_refused():
    """compare.json names each shape's kernel by trial, parameters and variant, and export builds
    what it names: parameters no trial was judged with, or a trial the ledger lacks, are refused
    (an edited compare.json shipped a configuration never judged under a judged trial's number)."""
    from runner.ship.export import ExportError, held_out_entries

    spec = shipped_spec(PIPELINES / "softmax-h200.yaml")  # four shapes
    hist = [Trial(params={"A": 1}, status="ok", agent="x", times=[1e-4] * 4, id=1, kept=True)]
    good = {"shapes": [_cmp(100e-6, 200e-6)] * 4}
    assert [r["use"] for r in dispatch_table(spec, hist, good, None)] == ["kernel"] * 4
    for edit in ({"params": {"A": 2}}, {"trial": 7}, {"variant": "0396ffca85e8"}):
        bad = json.loads(json.dumps(good))
        bad["shapes"][2]["tuned"].update(edit)
        with pytest.raises(ExportError, match="not an ok trial of this run's ledger"):
            dispatch_table(spec, hist, bad, None)
    held = {"shapes": [], "held_out": [{"shape": {"M": 4, "N": 2048}, "label": "4x2048",
                                        "ship": {"trial": 1, "params": {"A": 3}, "time_s": 1e-5, "baseline_s": 2e-5}}]}
    with pytest.raises(ExportError, match="held-out shape"):
        held_out_entries(held, ["N"], hist)


def test_a_variant_text_changed_after_its_trial_is_refused(tmp_path):
    """A template variant is named by the hash of its text; the ledger's variants table is not
    chained, so a text swapped under a judged id would be what compare and export build and a
    resumed run judges: the ledger's check (pipe show, a resume, compare, export) finds it."""
    import shutil
    import sqlite3

    from runner.core.errors import LedgerBroken
    from runner.core.records import variant_id
    from runner.ledger.ledger import Ledger
    from runner.ship.rundata import open_run

    run = tmp_path / "run"
    shutil.copytree(RUNS["rmsnorm"], run)
    open_run(run, frozen_spec(RUNS["rmsnorm"]), "export packages")  # intact: opened
    db = sqlite3.connect(run / "ledger.db")
    db.execute("INSERT INTO variants VALUES (?,?,?,?,?,?)", (variant_id("judged"), "template", "x", 0.0, "swapped", ""))
    db.commit()
    db.close()
    with pytest.raises(LedgerBroken, match=f"template variant {variant_id('judged')} was edited"):
        open_run(run, frozen_spec(RUNS["rmsnorm"]), "export packages")
    led = Ledger.read(run, damaged_ok=True)
    try:
        assert not led.verify().intact and "does not hash to its id" in led.verify().reason
    finally:
        led.close()


def test_a_cached_artifact_replaced_after_its_compile_is_compiled_again(tmp_path, monkeypatch):
    """The compile cache keys a build by its source; a file put in its place afterwards (another
    kernel's build) must not be what a trial, pipe compare or pipe export takes for it."""
    import shutil

    from runner.build.builder import Builder

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path))
    spec = shipped_spec(PIPELINES / "rmsnorm-cpu.yaml")
    b = Builder(spec)
    a, c = (b.render_all({"ACC": acc, "THREADS": 1, "UNROLL": 1})[0] for acc in (1, 4))
    assert a != c
    (pa,), _ = b.compiled([a])
    (pc,), _ = b.compiled([c])
    judged = open(pa, "rb").read()
    shutil.copyfile(pc, pa)  # another configuration's build under a's key
    (again,), _ = Builder(spec).compiled([a])
    assert open(again, "rb").read() == judged


def _compared(tmp_path, monkeypatch, op="softmax"):
    """A copy of a checked-in H200 run whose compare.json is written again by compare_and_write
    (pipe compare's writer, the timing itself stood in for by the run's own figures): the
    file and the ledger's record of its sha256, as a pipe compare of today leaves them."""
    import shutil

    from runner.ship import compare

    run = tmp_path / "run"
    shutil.copytree(RUNS[op], run)
    doc = json.loads((run / "compare.json").read_text())
    monkeypatch.setattr(compare, "compare_run", lambda *a, **kw: json.loads(json.dumps(doc)))
    compare.compare_and_write(run, tmp_path / "copy.json", frozen_spec(RUNS[op]))
    assert (tmp_path / "copy.json").read_bytes() == (run / "compare.json").read_bytes()
    return run


def _export(run, tmp_path, op="softmax"):
    return pipe_main("export", run, "--out", tmp_path / "o", "--spec", frozen_spec(RUNS[op]), cwd=ROOT)


def test_a_compare_json_changed_after_pipe_compare_wrote_it_is_refused(tmp_path, monkeypatch):
    """compare.json's verdicts (each shape's pick, the range table's lists and bounds, its drops
    and verified counts, the held-out ships) live only there: pipe compare records the sha256 of
    the bytes it writes in the ledger, and export refuses a compare.json that no longer hashes to
    the last record (s58 red team, D), here a shape's pick swapped for another ok trial of the
    ledger with its true parameters, which the ledger check of the names alone let through."""
    from runner.ledger.ledger import Ledger

    run = _compared(tmp_path, monkeypatch)
    r = _export(run, tmp_path)  # untouched: exported
    assert r.returncode == 0 and "trial #24" in r.stdout, r.stderr[-2000:]
    led = Ledger.read(run)
    try:
        hist = {t.id: t for t in led.trials()}
    finally:
        led.close()
    text = (run / "compare.json").read_text()
    doc = json.loads(text)
    other = hist[1]  # an ok trial, named with its own parameters: judged_as finds nothing wrong
    assert other.status == "ok" and doc["shapes"][0]["tuned"]["trial"] == 24
    doc["shapes"][0]["tuned"].update(trial=1, params=other.params, variant=other.variant)
    faster = json.loads(text)
    faster["shapes"][1]["tuned"]["time_s"] /= 10
    edits = {"a shape's pick": json.dumps(doc, indent=2) + "\n", "its time": json.dumps(faster, indent=2) + "\n",
             "a space": text.replace("{", "{ ", 1)}
    for what, edited in edits.items():
        assert edited != text, what
        (run / "compare.json").write_text(edited)
        r = _export(run, tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (what, r.stderr[-2000:])
        assert "compare.json was changed after pipe compare wrote it" in r.stderr, (what, r.stderr)
        assert r.stderr.strip().endswith("run pipe compare again") and len(r.stderr.strip().splitlines()) == 1
    (run / "compare.json").write_text(text)  # as compare wrote it: exported again
    assert _export(run, tmp_path).returncode == 0
    led = Ledger.read(run)
    try:  # the record: one, in a ledger still intact
        assert led.verify().intact and len(led.compares()) == 1
    finally:
        led.close()


def test_export_checks_compare_json_against_the_last_compare_record(tmp_path, monkeypatch):
    """The last record counts: an earlier compare's file put back is refused. A ledger that records
    compare's writes and holds no record refuses any compare.json; a run folder of an older pipe
    (no record at all, as tests/data's) exports its compare.json as it stands."""
    import sqlite3

    from runner.ship import compare
    from runner.ship.export import ExportError, export

    run = _compared(tmp_path, monkeypatch)
    first = (run / "compare.json").read_bytes()
    doc = json.loads(first)
    doc["date"] = "later"
    monkeypatch.setattr(compare, "compare_run", lambda *a, **kw: doc)
    compare.compare_and_write(run, None, frozen_spec(RUNS["softmax"]))
    (run / "compare.json").write_bytes(first)
    with pytest.raises(ExportError, match="compare record #2 of"):
        export(run, tmp_path / "o", spec_path=frozen_spec(RUNS["softmax"]))
    # the records and their head deleted (the ledger's check would name a missing record alone)
    db = sqlite3.connect(run / "ledger.db")
    db.executescript("DROP TRIGGER compares_no_delete; DELETE FROM compares; "
                     "DELETE FROM meta WHERE key='compare_head';")
    db.close()
    with pytest.raises(ExportError, match="compare.json has no record in the run's ledger"):
        export(run, tmp_path / "o", spec_path=frozen_spec(RUNS["softmax"]))
    legacy = tmp_path / "legacy"  # as checked in: no compares table, no compare_kept
    import shutil

    shutil.copytree(RUNS["rmsnorm"], legacy)
    assert export(legacy, tmp_path / "o", spec_path=frozen_spec(RUNS["rmsnorm"])).is_dir()


def test_a_compare_json_whose_digest_cannot_be_recorded_is_moved_aside(tmp_path, monkeypatch):
    """A compare whose record cannot be written (a ledger that refuses writes) leaves no
    compare.json that export would take as an older pipe's: the file is kept aside, named so."""
    import sqlite3

    from runner.ledger.ledger import Ledger
    from runner.ship.compare import CompareError

    def refuse(*a, **kw):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(Ledger, "add_compare", refuse)
    with pytest.raises(CompareError, match="kept as compare.unrecorded.json"):
        _compared(tmp_path, monkeypatch)
    run = tmp_path / "run"
    assert not (run / "compare.json").exists() and (run / "compare.unrecorded.json").is_file()


def test_a_size_given_only_inside_a_dimension_is_solved_from_the_inputs():
    """A MoE layer's rows are `T * 6`: no input has T as a dimension of its own, and the exported op
    named it in a NameError. The runtime now solves an affine dimension for its one unknown size
    (T = rows / 6), the shape check then holds every input to it, and a size no shape gives is an
    InputError that names it."""
    import torch

    from runner.ship.exported_runtime import InputError, Op

    spec = shipped_spec(PIPELINES / "moe-fine-h200.yaml")
    table = {**launch_table(spec), "op": "moe", "symbols": ["T"], "baked": [], "entries": [], "scalars": [],
             "inputs": [{"name": t.name, "dtype": t.dtype, "shape": [d.text for d in t.shape]} for t in spec.op.inputs],
             "outputs": [{"name": t.name, "dtype": t.dtype, "shape": [d.text for d in t.shape]} for t in spec.op.outputs]}
    op = Op(ROOT, table, None)
    x, w = torch.empty(37 * 6, 2048, dtype=torch.bfloat16), torch.empty(64, 2816, 2048, dtype=torch.bfloat16)
    offs = torch.empty(64, dtype=torch.int32)
    env = op.symbols_of({"x": x, "w": w, "offs": offs})
    assert env == {"T": 37} and op.output_shapes(env) == [[222, 2816]]
    with pytest.raises(InputError, match="cannot tell the size 'T' from the inputs' shapes"):
        op.symbols_of({"x": torch.empty(221, 2048, dtype=torch.bfloat16), "w": w, "offs": offs})  # no whole T
    with pytest.raises(InputError, match=r"'w' must have shape \[64, 2816, 2048\]"):
        op.symbols_of({"x": x, "w": w[:, :100], "offs": offs})
    table["inputs"] = [{"name": "x", "dtype": "bf16", "shape": ["T * U", "2048"]}]
    with pytest.raises(InputError, match="cannot tell the size 'T' from the inputs' shapes"):
        Op(ROOT, table, None).symbols_of({"x": x})
