"""One protocol for every loop that times candidate code (evaluate, the re-timing of a keep or a
goal check, pipe compare): the runner's launch mode, the physical floor, per-call samples.

The launch mode (CUDA graph replay or direct launches) of every arm timed at a shape is the
runner's: from the op's physical floor in auto mode, never from a candidate's own timing. Before,
the first job of a shape probed its own calls and every other arm (the incumbent, torch's
baseline in a goal check, torch.compile and Triton in pipe compare) ran in the mode it chose: a
kernel that spun on its first calls (those on a fresh output buffer) chose direct launches for
arms whose Python launch costs then counted. The judge runs in this process with a Python
kernel; the CPU runtime is given a mode and its prepared calls report the other one, as a
runtime probe fooled by such a kernel would."""
from __future__ import annotations

import json

import torch
import yaml

from runner.build.builder import Builder
from runner.core.figures import GRAPH_BELOW_S, floors, launch_mode
from runner.judge import worker
from runner.spec.spec import load_spec

from .conftest import FEW_ROWS, PIPELINES, pipe_main, shipped_spec


def test_auto_mode_goes_by_the_floor_and_a_named_mode_stands():
    spec = shipped_spec(PIPELINES / "softmax-range-h200.yaml")
    small, large = {"M": 26, "N": 274}, {"M": 32768, "N": 4096}
    fl = floors(spec, [small, large])
    assert fl[0]["floor"] < GRAPH_BELOW_S < fl[1]["floor"]
    assert launch_mode(spec, small) == "graph" and launch_mode(spec, large) == "direct"
    fine = shipped_spec(PIPELINES / "moe-fine-h200.yaml")  # T = 1 reads 6 experts: 15 us at the read bandwidth
    assert launch_mode(fine, {"T": 1}) == "graph" and launch_mode(fine, {"T": 2}) == "direct"
    decode = shipped_spec(PIPELINES / "decode-attention-h200.yaml")  # runtime.mode: graph
    assert {launch_mode(decode, s) for s in decode.op.shapes} == {"graph"}


def _judge(project, asked: list, lazy=None):
    # rmsnorm-cpu on FEW_ROWS (the same row lengths, a thirty-second of the float64 kernel's
    # work a call): what the runtime is asked and what each call finds are the same on any rows
    d = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())
    d["op"]["shapes"] = FEW_ROWS
    path = project / "pipelines" / "rmsnorm-cpu.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    spec = load_spec(path)
    j = worker.Judge(spec)
    j.census = None
    j.rt.mode = "auto"
    want = {launch_mode(spec, s) for s in spec.op.all_shapes}
    assert want == {"graph"}  # the CPU profile's floors here are under 20 us
    prepare, prepare_torch = j.rt.prepare, j.rt.prepare_torch

    def spy(call, mode):
        asked.append(mode)
        call.mode = "direct"  # what a probe of a candidate that spun on its first calls reports
        return call

    j.rt.prepare = lambda fn, values, geometry=None, mode=None: spy(prepare(fn, values, geometry, mode), mode)

    def torch_arm(fn, mode=None):
        return spy(lambda: prepare_torch(fn, mode)(), mode)

    j.rt.prepare_torch = torch_arm

    def kernel(x, w, out, M, N, eps):  # honest RMSNorm in float64, rounded once
        if lazy is not None and lazy():
            return  # the output keeps what the call before left there
        xd = x.double()
        out.copy_((xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + eps) * w.double()).float())

    j.rt.load = lambda artifact, entry, kinds: kernel

    def values(shape, inputs, outs, ws=(), geometry=None):
        named = {**inputs, **{t.name: o.view for t, o in zip(j.op.outputs, outs)}}
        return [named[a] if a in named else (shape[a] if a in shape else j.scalars[a]) for a in spec.kernel.args]

    j._values = values
    return spec, j


def test_every_arm_runs_in_the_runners_mode_whatever_a_candidates_call_reports(project):
    asked: list = []
    spec, j = _judge(project, asked)
    threads = torch.get_num_threads()
    try:
        n = len(spec.op.all_shapes)
        geometry = Builder(spec).geometry(dict(spec.start))
        r = j.evaluate({"seed": 5, "artifacts": ["py"] * n, "geometry": geometry})
        assert r["status"] == "ok", r
        r = j.baseline("reference")
        assert r["status"] == "ok", r
        r = j.retime([{"artifacts": ["py"] * n, "geometry": geometry}, {"torch": "reference"},
                      {"artifacts": ["py"] * n, "geometry": geometry}], rounds=2, seed=7)
        assert r["status"] == "ok", r
        cands = [[{"label": "#1", "artifact": "py", "geometry": geometry[i]}] for i in range(len(spec.op.shapes))]
        r = j.compare({"seed": 3, "rounds": 2, "compile": False, "arms": {}, "candidates": cands})
        assert r["status"] == "ok", r
    finally:
        torch.set_num_threads(threads)
    # candidates, torch eager, the copy: each asked for graph replay, the mode the runner chose
    # from the floor, though every call before it reported direct launches
    assert len(asked) >= 4 * len(spec.op.shapes) and set(asked) == {"graph"}, asked


def _every_other_call_lazy():
    calls = [0]

    def lazy():
        calls[0] += 1
        return calls[0] % 2 == 0
    return lazy


def _compare(j, spec, seed: int) -> dict:
    cands = [[{"label": "#1", "artifact": "py", "geometry": g}]
             for g in Builder(spec).geometry(dict(spec.start), spec.op.shapes)]
    threads = torch.get_num_threads()
    try:
        r = j.compare({"seed": seed, "rounds": 2, "compile": False, "arms": {}, "copy": False, "candidates": cands})
    finally:
        torch.set_num_threads(threads)
    assert r["status"] == "ok", r
    assert all(s["torch eager"]["error"] is None for s in r["shapes"])  # torch's arms are the runner's
    return r


def _retime(j, spec, jobs: int, rounds: int, seed: int, torch_arm: bool = False) -> dict:
    n = len(spec.op.all_shapes)
    job = {"artifacts": ["py"] * n, "geometry": Builder(spec).geometry(dict(spec.start))}
    threads = torch.get_num_threads()
    try:
        return j.retime([job] * jobs + ([{"torch": "reference"}] if torch_arm else []), rounds=rounds, seed=seed)
    finally:
        torch.set_num_threads(threads)


def test_compare_holds_a_candidate_to_the_physical_floor(project):
    """pipe compare picks what the exported table ships: a candidate timed faster than the op's
    bytes allow (a fooled timer, here a runtime whose timer reads 0.1 us) is an error there, as
    it is in evaluate and the re-timing; torch's arms, the runner's own, are not judged by it."""
    spec, j = _judge(project, [])
    j.rt.timer = lambda call, sync: (call(), sync(), 1e-7)[-1]
    for s in _compare(j, spec, 3)["shapes"]:
        assert s["#1"]["error"].startswith("impossible: 0.100 us is below the physical floor"), s["#1"]


def test_a_kernel_lazy_on_some_calls_of_a_retiming_is_wrong(project):
    """Every other call of the re-timing skips its work (the output keeps the other value set's
    answer). Each timed call's outputs are sampled at secret positions as it returns, as in
    evaluate's loop: the re-timing that would decide a keep or a goal finds it wrong."""
    spec, j = _judge(project, [], _every_other_call_lazy())
    r = _retime(j, spec, jobs=1, rounds=2, seed=9, torch_arm=True)
    assert r["status"] == "wrong" and r["job"] == 0, r
    assert "sampled as it returned are outside the error budget" in r["reason"], r["reason"]


def test_an_honest_kernel_passes_the_retimings_samples(project):
    spec, j = _judge(project, [])
    r = _retime(j, spec, jobs=2, rounds=3, seed=11)
    assert r["status"] == "ok" and len(r["medians"]) == 3, r


def test_pipe_compare_samples_every_timed_call_of_a_candidate(project):
    """A candidate that skips the work of every other timed call in pipe compare is an error
    there, whatever its first and last calls give: the table never takes it."""
    spec, j = _judge(project, [], _every_other_call_lazy())
    for s in _compare(j, spec, 5)["shapes"]:
        assert s["#1"]["error"].startswith("timed: timed call"), s["#1"]


def test_a_fresh_output_in_a_retiming_or_compare_holds_no_sentinel(project, monkeypatch):
    """The re-timing and pipe compare write no decoy before each call, so their first call on
    fresh buffers used to find the guards' sentinel inside the output, a sign that no later call
    gives: a kernel could tell the first call of such a loop from the rest without keeping any
    state. Every output now starts as a decoy (a plausible wrong answer): the kernel here looks
    at its output at entry, and on no call of either loop does it find the sentinel."""
    from runner.judge.verify import GUARD_POISON

    seen: list = []
    spec, j = _judge(project, [])
    honest = j.rt.load("py", None, None)

    def spying(*args):
        out = args[spec.kernel.args.index("out")]
        seen.append(bool((out == GUARD_POISON).any()))
        honest(*args)

    j.rt.load = lambda artifact, entry, kinds: spying
    asked = []  # and both loops take their arms' order from worker._round_orders
    real = worker._round_orders
    monkeypatch.setattr(worker, "_round_orders", lambda n, rounds: asked.append((n, rounds)) or real(n, rounds))
    r = _retime(j, spec, jobs=2, rounds=2, seed=13, torch_arm=True)
    assert r["status"] == "ok", r
    _compare(j, spec, 17)
    assert seen and not any(seen), seen
    # the re-timing: two jobs and torch's arm, two rounds; compare: the candidate and torch
    # eager, two rounds, at each shape
    assert asked == [(3, 2)] + [(2, 2)] * len(spec.op.shapes), asked


def test_arm_orders_are_secret_and_mirrored():
    """The arms of a side-by-side timing run in an order drawn in secret for each even round and
    reversed the round after (judge audit, gap 10: no arm can aim at the arm timed after it).
    Each pair of rounds puts every arm in each place once from either end, and the draws differ
    from request to request (a fixed alternation gave one order). That pipe compare and the
    re-timing take their orders from here: the sentinel test above."""
    orders = worker._round_orders(5, 4)
    assert len(orders) == 4 and all(sorted(o) == list(range(5)) for o in orders)
    assert orders[1] == orders[0][::-1] and orders[3] == orders[2][::-1]
    firsts = {tuple(worker._round_orders(5, 2)[0]) for _ in range(40)}
    assert len(firsts) > 10  # 120 orders of 5 arms: 40 draws give many


def test_a_persisting_l2_set_aside_the_runtime_could_not_remove_reaches_the_verdict():
    """The CUDA runtime sets the persisting-L2 set-aside to 0 before any candidate loads; where
    the driver refuses (None) or leaves some, every reply says so, and the trial records it. A
    runtime without the notion (the CPU's) and one that made it 0 add nothing."""
    from types import SimpleNamespace as NS

    for value, want in ((None, {"persisting_l2_bytes": None}), (4096, {"persisting_l2_bytes": 4096}), (0, {})):
        assert worker._capped({}, NS(rt=NS(persisting_l2=value))) == want
    assert worker._capped({}, NS(rt=NS())) == {}
    capped = {"log_capped": 3}
    assert worker._capped(capped, NS(rt=NS(printf_fifo=1 << 20))) == {**capped, "printf_fifo_bytes": 1 << 20}


def test_no_call_finds_what_an_earlier_call_left_where_the_runtime_scrubs(project):
    """State a launch leaves behind (on a GPU: shared memory, the threads' local windows; here a
    dict the kernel keeps) never reaches a candidate's call: the runtime's scrub runs ahead of
    every call of a candidate in every loop (evaluate's verification, warm-up, timed and checked
    calls, the re-timing, pipe compare), ahead of the refresh and the flush where the call is
    timed, so no call finds a mark and none can tell a timed call by what it finds. The
    control: the runtime's own callable, called twice, does find it. On the GPU:
    test_judge_cuda.py's residue tests and tools/residue_probe.py."""
    residue: dict = {}
    seen: list = []  # (timed, found the last call's mark)
    timing = [False]
    order: list = []  # what ran ahead of each timed call since the last call of the kernel
    spec, j = _judge(project, [])

    def kernel(x, w, out, M, N, eps):
        seen.append((timing[0], residue.get("mark", False)))
        order.append("call")
        xd = x.double()
        out.copy_((xd * torch.rsqrt((xd * xd).mean(-1, keepdim=True) + eps) * w.double()).float())
        residue["mark"] = True

    def scrub(local_bytes=0):
        order.append("scrub")
        residue.clear()

    j.rt.load = lambda artifact, entry, kinds: kernel
    j.rt.scrub = scrub
    launched: list = []  # the candidate's bare callables, as the runtime's prepare made them
    prepare = j.rt.prepare

    def prepared(*a, **k):
        launched.append(prepare(*a, **k))
        return launched[-1]

    j.rt.prepare = prepared
    timer, flush = j.rt.timer, j.rt.flush

    def timed(call, sync):
        timing[0] = True
        order.append("timed" if call in launched else "timed arm")
        try:
            return timer(call, sync)
        finally:
            timing[0] = False

    def flushed():
        order.append("flush")
        flush()

    j.rt.timer, j.rt.flush = timed, flushed
    object.__setattr__(spec.runtime, "cache", "cold")  # (the spec's is warm) a flush ahead of each timed call,
    j.rt._flush_buf = torch.empty(16)  # over a small buffer
    n = len(spec.op.all_shapes)
    geometry = Builder(spec).geometry(dict(spec.start))
    threads = torch.get_num_threads()
    try:
        assert j.evaluate({"seed": 5, "artifacts": ["py"] * n, "geometry": geometry})["status"] == "ok"
        job = {"artifacts": ["py"] * n, "geometry": geometry}
        assert j.retime([job, {"torch": "reference"}, job], rounds=2, seed=7)["status"] == "ok"
        _compare(j, spec, seed=3)
    finally:
        torch.set_num_threads(threads)
    assert sum(t for t, _ in seen) > 20 and len(seen) > sum(t for t, _ in seen)  # timed calls, and others
    assert not any(found for _, found in seen), sum(found for _, found in seen)
    # every timed call of every arm: a scrub since the last call, ahead of the flush (local memory
    # goes through the cache the flush empties); a candidate's timer times its bare call, the
    # scrub already done
    assert order.count("timed") > 20 and order.count("timed arm") > 0
    for i, ev in enumerate(order):
        if ev.startswith("timed"):
            assert ev == "timed arm" or order[i + 1] == "call", order[i - 3:i + 2]
            before = order[:i][::-1]
            last = min([before.index(e) for e in ("call", "timed", "timed arm") if e in before] or [len(before)])
            assert "scrub" in before[:last] and before.index("scrub") > before.index("flush"), order[i - 4:i + 1]
    # the control: the runtime's own callable keeps the mark from one call to the next
    residue.clear()
    raw = prepare(kernel, [torch.ones(2, 4), torch.ones(4), torch.empty(2, 4), 2, 4, 1e-6])
    raw(), raw()
    assert seen[-1] == (False, True)


def test_the_local_frame_a_scrub_covers_is_read_whichever_way_cuda_core_gives_it():
    """cuda.core 1.2 gives a kernel's local frame as a property; other versions as a method. The
    scrub covers each frame size it reads, so a size misread as 0 would leave that kernel's local
    memory as its last launch left it (the H200 showed it: session 29)."""
    from types import SimpleNamespace as NS

    from runner.build.backends import cuda

    assert cuda.local_bytes(NS(attributes=NS(local_size_bytes=1032))) == 1032
    assert cuda.local_bytes(NS(attributes=NS(local_size_bytes=lambda: 24))) == 24
    assert cuda.local_bytes(NS(attributes=NS(), handle=None)) == 0  # neither: nothing to scrub, no error


def test_fresh_timed_calls_only_where_asked_and_never_a_repeat():
    """_alternate's `fresh` (every timed loop of the judge, on every backend): about half the timed calls get
    their set with one element of every row of every salted input replaced by a value from
    elsewhere in it (so every row's sum changes, not its order alone), no two alike, and the
    loop's figure is theirs; without it no call is marked fresh, so every call counts."""
    import torch

    from runner.judge.worker import _alternate, _fresh_times

    base = {"x": torch.randn(6, 10), "w": torch.randn(10), "offs": torch.tensor([0, 3, 6])}
    sets = [{k: v.clone() for k, v in base.items()},
            {k: (v + 1 if v.is_floating_point() else v.clone()) for k, v in base.items()}]
    inputs = {k: v.clone() for k, v in base.items()}
    state, refresh = _alternate(inputs, sets, frozenset({"offs"}), fresh=True)
    seen = []
    for i in range(120):
        refresh()
        seen.append(inputs["x"].clone())
        own = sets[state["cur"]]
        assert torch.equal(inputs["offs"], own["offs"])  # never salted
        if i in state["fresh"]:
            assert bool((inputs["x"] != own["x"]).any(dim=1).all()) and not torch.equal(inputs["w"], own["w"])
            assert bool(((inputs["x"] != own["x"]).sum(dim=1) == 1).all())  # one element a row
            assert bool((inputs["x"].sum(dim=1) != own["x"].sum(dim=1)).all())  # its statistics move
        else:
            assert torch.equal(inputs["x"], own["x"]) and torch.equal(inputs["w"], own["w"])
    assert 30 < len(state["fresh"]) < 90
    fresh = [seen[i] for i in sorted(state["fresh"])]
    assert all(not torch.equal(a, b) for n, a in enumerate(fresh) for b in fresh[n + 1:])
    assert _fresh_times([1.0, 2.0, 3.0], {"fresh": {5, 7}}, 5) == [1.0, 3.0]
    # without `fresh`: only the planned last call is salted, and it is not marked: every call counts
    inputs = {k: v.clone() for k, v in base.items()}
    state, refresh = _alternate(inputs, sets, frozenset({"offs"}))
    refresh.plan(10, 3)
    for _ in range(10):
        refresh()
    assert state["fresh"] == set() and _fresh_times([1.0, 2.0], state, 0) == [1.0, 2.0]


def test_a_gpu_loop_checks_its_last_call_and_a_secret_few_fresh_ones():
    """_fresh_checked: every salted call where the limit is None (the CPU backend); else the
    planned last call (pairs) and `limit` fresh ones (rows), drawn anew each time; a row salt
    made again from its seed replaces the same elements, one a row, each by a value from
    elsewhere in the input (a swap inside a row kept its sum: a memo of row statistics
    answered right)."""
    import torch

    from runner.judge.worker import _RowSalt, _apply_salt, _fresh_checked

    last = [("x", 1, 2)]
    fresh = [[_RowSalt("x", s)] for s in range(10)]
    # value set 0's calls, then set 1's (one fresh call each: a call's salt is its own object)
    samples = [(0, None, [])] + [(k % 2, sa, []) for k, sa in enumerate(fresh)] + [(0, last, []), (0, last, [])]
    every = _fresh_checked(samples, None)
    assert len(every[0]) == 6 and len(every[1]) == 5 and every[0][-1] is last
    picks = set()
    for _ in range(30):
        got = _fresh_checked(samples, 3)  # three of the loop's fresh calls, whatever their set
        flat = [sa for k in got for sa in got[k]]
        assert len(flat) == 4 and last in got[0] and all(sa in fresh[k % 2::2] for k in got for sa in got[k]
                                                          if sa is not last)
        picks |= {id(sa) for sa in flat if sa is not last}
    assert len(picks) > 4  # drawn anew: not always the same three
    x = torch.arange(60.0).reshape(6, 10)
    a, b = {"x": x.clone()}, {"x": x.clone()}
    _apply_salt(a, fresh[3])
    _apply_salt(b, [_RowSalt("x", 3)])
    assert torch.equal(a["x"], b["x"])
    assert bool(((a["x"] != x).sum(dim=1) == 1).all())  # one element of every row
    assert bool((a["x"].sum(dim=1) != x.sum(dim=1)).all())  # and so its sum
    assert all(float(v) in set(x.reshape(-1).tolist()) for v in a["x"].reshape(-1))  # values of the input


def test_pooled_loops_check_a_secret_few_fresh_calls_of_every_loop():
    """A re-timing or a comparison pools the samples of several timed loops: the fresh calls
    checked are drawn loop by loop (each salt knows its loop), so no loop goes unchecked."""
    from runner.judge.worker import _RowSalt, _Salt, _alternate, _fresh_checked

    samples = []
    for loop in range(4):
        samples += [(0, _Salt(loop + 1, [_RowSalt("x", 10 * loop + j)]), []) for j in range(10)]
        samples.append((1, _Salt(loop + 1, [("x", 1, 2)]), []))
    for _ in range(20):
        got = _fresh_checked(samples, 3)
        fresh = [sa for sa in got.get(0, [])]
        assert sorted(sa.loop for sa in fresh) == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
        assert len(got[1]) == 4  # every loop's last call
    # _alternate's plan() starts a loop: the salts drawn after it carry its number
    import torch

    base = {"x": torch.randn(4, 8)}
    inputs = {"x": base["x"].clone()}
    state, refresh = _alternate(inputs, [base, {"x": base["x"] + 1}], fresh=True)
    refresh.plan(6, 0)
    for _ in range(6):
        refresh()
        assert state["salt"] is None or state["salt"].loop == 1
    refresh.plan(6, 0)
    loops = set()
    for _ in range(6):
        refresh()
        loops |= {state["salt"].loop} if state["salt"] is not None else set()
    assert loops == {2}


def test_the_judges_own_work_past_the_deadline_is_no_hang_while_it_reports_progress(project, tmp_path):
    """The deadline (runtime.timeout_s) runs from the judge's last report of progress (Judge.beat),
    not from the request's start: a trial whose own float64 references take 0.05 s each (about 90
    them) is `ok` under a 2 s deadline (before: `hang`, the kernel blamed for the judge's work, as
    an honest decode-attention kernel was on an H100, session 63). A kernel that hangs in a call
    still reports nothing and is killed (test_hang_is_killed_by_the_watchdog)."""
    (project / "pipelines" / "slowref.py").write_text(
        "import time\nimport torch\n\n\n"
        "def rmsnorm(x, w, eps):\n"
        "    if x.dtype == torch.float64:  # the verdict's reference: slow, as a float64 one at 2^30 elements is\n"
        "        time.sleep(0.05)\n"
        "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)\n")
    text = (PIPELINES / "rmsnorm-cpu.yaml").read_text()
    assert "reference: runner.ops.reference:rmsnorm" in text and "  timeout_s: 30\n" in text
    spec = project / "pipelines" / "slow.yaml"
    spec.write_text(text.replace("reference: runner.ops.reference:rmsnorm", "reference: slowref:rmsnorm")
                    .replace("  timeout_s: 30\n", "  timeout_s: 2\n"))
    r = pipe_main("eval", spec, "--params", json.dumps({"ACC": 8, "UNROLL": 1, "THREADS": 1}),
                  "--run-dir", tmp_path / "run", "--json", cwd=project)
    assert json.loads(r.stdout)["status"] == "ok", (r.stdout + r.stderr)[-2000:]
    from runner.ship.rundata import open_run

    (trial,) = open_run(tmp_path / "run", None, "test").history
    assert trial.details["judge_wall_s"] > 3, trial.details["judge_wall_s"]  # past the 2 s, reporting progress
