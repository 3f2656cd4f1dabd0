import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = ROOT / "pipelines"


def load_script(rel: str):
    """A script of the repo (benchmarks/, tools/) as a module, for its functions."""
    import importlib.util

    path = ROOT / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_SHIPPED_SPECS: dict = {}


def shipped_spec(path):
    """load_spec(PATH) of a spec of the repo's pipelines/, loaded once in this test process,
    each caller handed a deep copy of its own (a test may change what it gets). Checking a CUDA
    flagship's space over its shapes takes seconds (softmax-h200 some three, and some forty
    tests read it); the files are the repo's and change during no test run. Tests of loading
    itself (a spec's errors, a changed file's hash) call load_spec."""
    import copy

    from runner.spec.spec import load_spec

    p = Path(path).resolve()
    assert p.parent == PIPELINES.resolve(), f"not a spec of the repo's pipelines/: {p}"
    if p not in _SHIPPED_SPECS:
        _SHIPPED_SPECS[p] = load_spec(p)
    return copy.deepcopy(_SHIPPED_SPECS[p])


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


# Session-scoped set-ups built once for the whole test run (build_once, below): the tests that
# use one are kept on one xdist worker, which builds it, so that the other never waits for it.
SHARED_SETUPS = ("shared_cpu_run", "shipped_cpu_run", "exported_h200", "moe_specs")


def _xdist_group(item) -> str | None:
    """The xdist group of a test: the shared set-up it uses, else its module when it uses a
    module-scoped set-up (a worker and its memoized trials, a recorded run), else none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    shared = [n for n in SHARED_SETUPS if n in info.name2fixturedefs]
    if shared:
        return shared[0]
    if any(d.scope in ("module", "class", "package") for defs in info.name2fixturedefs.values() for d in defs):
        return item.module.__name__
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    if not has_cuda():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
    # Under xdist's --dist loadgroup (the README's test command) the tests that share a set-up
    # stay on one xdist worker, so it is built once; every other test goes where there is room.
    for item in items:
        group = _xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    yield  # the other plugins' hooks: xdist's names each marked test's group
    _carry_xdist_groups(items)


def _carry_xdist_groups(items) -> None:
    """pytest-xdist (3.8) tells its loadgroup scheduler a test's group by appending "@group" to
    item._nodeid; pytest 9.2 reads a test's id from item._id instead, so the groups were lost
    without a word and each module-scoped set-up was built on both workers (pytest-xdist
    issue 1386). The suffixed id is carried over to where pytest reads it."""
    if not hasattr(pytest.Item, "_id"):
        return  # an older pytest: item._nodeid is the id itself
    from _pytest.nodeid import NodeId

    for item in items:
        want = item.__dict__.get("_nodeid")
        if want and want != item.nodeid:
            item._id = NodeId.parse(want)


@pytest.fixture
def project(tmp_path):
    """A scratch project folder: pipelines/ and links to the repo's templates and profiles."""
    (tmp_path / "pipelines").mkdir()
    for d in ("kernel_templates", "hw_profiles"):
        os.symlink(ROOT / d, tmp_path / d)
    return tmp_path


# rmsnorm-cpu.yaml's two timed shapes (512x4096, 2048x1024) with fewer rows: the same row
# lengths, which is what its template and its kernels' sources see, for a thirty-second of the
# judge's work. For tests of what the loop, the ledger or an agent does with trials, where how
# long a trial takes is asserted nowhere; its extra shapes (one row, odd sizes) stay.
FEW_ROWS = [{"M": 16, "N": 4096}, {"M": 64, "N": 1024}]


def run_root(tmp_path_factory) -> Path:
    """The folder of this whole test run: under xdist, the parent that the workers' own base
    folders share (each worker is a session of its own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    # One compile cache for the whole test run, away from the user's ~/.cache, shared by the
    # xdist workers (a kernel built on one is found by the other; the backends write each
    # artifact by an atomic rename) and set before any module-scoped set-up starts a pipe.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIPE_CACHE_DIR", str(run_root(tmp_path_factory) / "pipe-cache"))
        yield


def pipe_cmd() -> list[str]:
    exe = shutil.which("pipe")
    return [exe] if exe else [sys.executable, "-m", "runner.cli"]


def tune_compare_export(spec, run, pkgs, trials: int, points: int = 6, verify_sizes: int = 4) -> None:
    """A short GPU run of SPEC into RUN (`pipe run --max-trials TRIALS`), its `pipe compare`
    (POINTS secret points, 2 rounds, the top 2, each table kernel verified at VERIFY_SIZES sizes
    a range: the sweep itself is tested on the CPU, in tests/test_table_verify.py) and its
    `pipe export` into PKGS, each asserted
    to end as it should: the set-up of the range and attention GPU tests. Each stage's wall
    time is printed (pytest's -rA shows it), so that a set-up that outgrows a device call
    says which stage grew."""
    def pipe(*args):
        t0 = time.monotonic()
        r = subprocess.run(pipe_cmd() + list(args), cwd=ROOT, capture_output=True, text=True, timeout=900)
        print(f"pipe {args[0]} {Path(str(spec)).name}: {time.monotonic() - t0:.1f} s, exit {r.returncode}")
        return r

    # PIPE_TESTS_ANY_GPU=1: the h200 specs' runs on another GPU (an H100 when no H200 is lent):
    # correctness only, the profile's match skipped (--no-hw-check) and its figures not the GPU's
    any_gpu = ["--no-hw-check"] if os.environ.get("PIPE_TESTS_ANY_GPU") == "1" else []
    r = pipe("run", str(spec), "--run-dir", str(run), "--max-trials", str(trials), "-q", *any_gpu)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    r = pipe("compare", str(run), "--points", str(points), "--rounds", "2", "--top", "2",
             "--verify-sizes", str(verify_sizes))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "worst regret" in r.stdout
    r = pipe("export", str(run), "--out", str(pkgs))
    assert r.returncode == 0, r.stderr[-3000:]


def small_decode_space(d: dict) -> None:
    """A decode-attention spec's space cut to six configurations (SPLIT 128, 512, 2048 at NW 4
    and 8, the session-15 winners otherwise) and a budget of six trials: the GPU tests' set-up."""
    d["search"]["params"].update({"SPLIT": [128, 512, 2048], "NW": [4, 8], "TW": [16], "STAGES": [2], "VEC": [8],
                                  "BULK": [0]})
    if "WAVES" in d["search"]["params"]:  # the fixed splits only (WAVES 0)
        d["search"]["params"]["WAVES"] = [0]
    d["search"]["start"] = {**d["search"]["start"], "SPLIT": 512, "NW": 8, "TW": 16, "STAGES": 2, "VEC": 8}
    d["goal"]["budget"] = {"trials": 6, "minutes": 20}


def assert_every_trial_verified_across_the_domain(run) -> None:
    """Every trial of RUN is ok and was verified on shapes drawn from the domain."""
    from runner.ship.rundata import open_run

    rd = open_run(run, None, "test")
    assert rd.history and all(t.status == "ok" for t in rd.history), [(t.status, t.reason) for t in rd.history]
    for t in rd.history:
        assert t.details["domain_checks"]


def run_exported(root, code: str) -> str:
    """CODE (dedented) in a fresh interpreter beside exported packages in ROOT (pipe's own
    folder on the path too, for its references): its stdout, asserted exit 0."""
    import textwrap

    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=root, capture_output=True, text=True,
                       timeout=600, env={"PYTHONPATH": f"{root}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout


def pipe_main(*args, cwd=None, env: dict | None = None) -> subprocess.CompletedProcess:
    """`pipe ARGS` through the CLI's own entry (runner.cli.main) in this process: the exit
    code, stdout and stderr that a `pipe` process gives, without the process and its start-up
    (the interpreter, torch, pipe's modules: some three seconds of CPU). A run's judge is still
    a worker process of its own. For tests of what a command does, says and returns; tests of
    the process itself (signals, a fresh interpreter's imports, a lock another process holds)
    start `pipe`."""
    import contextlib
    import io

    from runner import cli

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        if cwd is not None:
            mp.chdir(cwd)
        for k, v in (env or {}).items():
            mp.setenv(k, str(v))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main([str(a) for a in args])
            except SystemExit as e:  # argparse's usage errors, as the process would exit
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(["pipe", *map(str, args)], rc, out.getvalue(), err.getvalue())


def eval_variant(project, run_dir, name: str, text: str, params: dict, spec: str = "rmsnorm-cpu.yaml"):
    """`pipe eval --json` of a variant (its whole text, written to `project/NAME.cpp.j2`) of a
    shipped spec copied into `project`: (the CompletedProcess, its stdout and stderr together)."""
    import json

    sp = project / "pipelines" / spec
    sp.write_text((PIPELINES / spec).read_text())
    variant = project / f"{name}.cpp.j2"
    variant.write_text(text)
    r = pipe_main("eval", sp, "--params", json.dumps(params), "--variant", variant, "--run-dir", run_dir, "--json",
                  cwd=project)
    return r, r.stdout + r.stderr


def build_once(tmp_path_factory, name: str, make) -> Path:
    """The folder run_root/shared/NAME, filled by make(folder) once for the whole test run:
    under xdist the first worker to ask builds it while the other waits on a lock, then both
    use it. Its users only read it (copy it before changing anything). When make fails, the
    next to ask tries again."""
    import fcntl

    root = run_root(tmp_path_factory) / "shared"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


# -- the judge's test benches -------------------------------------------------------------------
# test_judge_cpu, test_judge_redteam, test_judge_issue18, test_judge_cuda and test_forbid_compiled
# each judge a small spec whose template holds a switch (HACK: one behaviour of the kernel per
# value) through the real path. The specs are built from the parts below, the benches by JudgeBench.

ROW_TOLERANCE = {"atol": 1.0e-3, "rtol": 1.6e-2}  # softmax's budget, bf16 or fp32


def hack_spec(name: str, template: Path, *, op: dict, kernel: dict, params: dict, hardware: str = "host-cpu",
              runtime: dict | None = None, baseline: str | None = "none", forbidden=(), agent: dict | None = None,
              trials: int = 100, description: str | None = None) -> str:
    """The YAML text of a test spec; kernel takes the template's path first."""
    d: dict = {"name": name}
    if description:
        d["description"] = description
    d["hardware"] = hardware
    d["op"] = op
    d["kernel"] = {"template": str(template), **kernel}
    if runtime is not None:
        d["runtime"] = runtime
    if baseline is not None:
        d["baseline"] = baseline
    d["search"] = {"params": params}
    d["forbidden"] = list(forbidden)
    d["agent"] = agent or {"strategy": "grid"}
    d["goal"] = {"budget": {"trials": trials}}
    return yaml.safe_dump(d, sort_keys=False, width=1000)


def rmsnorm_op(shapes: list[dict], dists: list[str], tolerance: float = 1.0e-5) -> dict:
    """Row RMSNorm in fp32 (x, w -> out), as the CPU benches judge it."""
    return {"reference": "runner.ops.reference:rmsnorm", "dtype": "fp32",
            "inputs": {"x": {"shape": ["M", "N"], "dist": dists}, "w": {"shape": ["N"], "dist": "positive"}},
            "outputs": {"out": {"shape": ["M", "N"]}},
            "scalars": {"eps": {"value": 1.0e-6, "type": "f32"}},
            "shapes": shapes, "tolerance": {"atol": tolerance, "rtol": tolerance},
            "bytes": "elem * (2 * M * N + N)", "flops": "4 * M * N"}


def rmsnorm_hack_spec(name: str, description: str, template: Path, hacks: list[str], dists: list[str],
                      timeout_s: float, rep_ms: float = 10) -> str:
    """The CPU benches' spec (test_judge_cpu, test_judge_redteam): RMSNorm on two small shapes,
    a short timing budget, one HACK value a behaviour."""
    return hack_spec(name, template, description=description,
                     op=rmsnorm_op([{"M": 64, "N": 256}, {"M": 33, "N": 100}], dists),
                     kernel={"entry": "rmsnorm_cpu", "args": ["x", "w", "out", "M", "N", "eps"]},
                     runtime={"cache": "warm", "warmup_ms": 2, "rep_ms": rep_ms, "checks": 2, "timeout_s": timeout_s},
                     params={"HACK": hacks}, forbidden=["fast_math", "library_calls", "side_streams", "lower_precision"],
                     agent={"strategy": "random", "seed": 0})


def row_op(reference: str, dtype: str, shapes: list[dict], dist=None, tolerance: dict = ROW_TOLERANCE,
           scalars: dict | None = None) -> dict:
    """A row-wise op of one input x and one output y (softmax, LayerNorm without affine)."""
    x: dict = {"shape": ["M", "N"]}
    if dist is not None:
        x["dist"] = dist
    d = {"reference": reference, "dtype": dtype, "inputs": {"x": x}, "outputs": {"y": {"shape": ["M", "N"]}}}
    if scalars:
        d["scalars"] = scalars
    d.update(shapes=shapes, tolerance=tolerance, bytes="2 * M * N * elem")
    return d


SOFTMAX_CUDA_KERNEL = {"entry": "soft", "args": ["x", "y", "M", "N"], "grid": "M", "block": "256"}


class JudgeBench:
    """A template and its spec written to root, with the spawned worker and the evaluator
    that judge it; run() keeps one trial a switch value unless asked for a fresh one."""

    def __init__(self, root: Path, template_name: str, template: str, spec_name: str, spec_text: str,
                 log_name: str = "worker.log", switch: str = "HACK"):
        from runner.judge.worker import Worker
        from runner.judge.evaluator import Evaluator
        from runner.spec.spec import load_spec

        self.root = root
        self.template = root / template_name
        self.template.write_text(template)
        (root / spec_name).write_text(spec_text)
        self.spec = load_spec(root / spec_name)
        self.log = root / log_name
        self.worker = Worker(self.spec, str(self.log))
        self.ev = Evaluator(self.spec, self.worker, None)
        self.switch = switch
        self.memo: dict = {}

    def run(self, value: str, fresh: bool = False):
        """The trial of one behaviour (kept for the next call unless fresh)."""
        if fresh or value not in self.memo:
            self.memo[value] = self.ev.run({self.switch: value}, "test")
        return self.memo[value]

    def build_unchecked(self, value: str) -> list[str]:
        """The kernel built with g++ directly, past the CPU backend's static source rules."""
        import subprocess

        from runner.build.backends import cpu

        arts = []
        for i, src in enumerate(self.ev.builder.render_all({self.switch: value})):
            cpp = self.root / f"unchecked-{value}-{i}.cpp"
            cpp.write_text(src)
            lib = self.root / f"unchecked-{value}-{i}.so"
            subprocess.run([cpu.CXX, *cpu.BASE_FLAGS, str(cpp), "-o", str(lib)], check=True, capture_output=True)
            arts.append(str(lib))
        return arts

    def job(self, value: str, seed: int) -> dict:
        """An evaluate request for a worker, of the kernel built past the static rules."""
        return {"seed": seed, "artifacts": self.build_unchecked(value), "geometry": self.ev.builder.geometry({self.switch: value})}

    def close(self) -> None:
        self.worker.close()


def second_writes_first(judge) -> list:
    """Installs on a real judge a write after each call of every second candidate it prepares (a
    pair a shape), to the first one's back band, as a kernel's last store would be (the judge's
    look after each candidate's calls, test_judge_bystanders and test_judge_cuda); the outputs it
    made, which a test may clear between requests."""
    made, outputs, prepare = [], judge._outputs, judge._prepare

    def outputs_kept(shape, decoy=False, place=None):
        made.append(outputs(shape, decoy, place))
        return made[-1]

    def prepared(fn, values, geometry, mode=None):
        call = prepare(fn, values, geometry, mode)
        if len(made) % 2:  # the first candidate's
            return call
        victim = made[-2][0]

        def writer():
            call()
            victim.buf[victim.front + victim.numel] += 1
        return writer
    judge._outputs, judge._prepare = outputs_kept, prepared
    return made


def module_bench(name: str, make):
    """A module-scoped fixture: the bench make(root) in a fresh folder with a compile cache of
    its own there (no artifact from an earlier run); PIPE_CACHE_DIR is restored and the
    worker closed after the module."""

    @pytest.fixture(scope="module")
    def bench(tmp_path_factory):
        root = tmp_path_factory.mktemp(name)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("PIPE_CACHE_DIR", str(root / "cache"))
            b = make(root)
            try:
                yield b
            finally:
                b.close()

    return bench


def explain(t) -> str:
    return f"status={t.status!r} reason={t.reason!r} times={t.times}"


# -- set-ups shared by modules, built once for the whole test run -------------------------------

CPU_RUN_TRIALS = 5


@pytest.fixture(scope="session")
def shared_cpu_run(tmp_path_factory):
    """One real run of the shipped CPU pipeline with its goal target taken out, so that its
    budget of CPU_RUN_TRIALS trials ends it, on FEW_ROWS, made in a project folder of its own
    (pipelines/ and links to the repo's templates and profiles) by `pipe run
    pipelines/rmsnorm-cpu.yaml --run-dir base -q` (through pipe_main): (project, run folder,
    the exit code and stderr). test_tamper tampers with copies of it, made in the same project
    (the spec path the run recorded resolves there); both xdist workers may take tamper tests."""

    def make(proj: Path) -> None:
        (proj / "pipelines").mkdir()
        for d in ("kernel_templates", "hw_profiles"):
            os.symlink(ROOT / d, proj / d)
        d = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())
        d["goal"] = {"budget": {"trials": CPU_RUN_TRIALS}}
        d["op"]["shapes"] = FEW_ROWS  # what is tampered with is the ledger, not the figures
        (proj / "pipelines" / "rmsnorm-cpu.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
        r = pipe_main("run", "pipelines/rmsnorm-cpu.yaml", "--run-dir", "base", "-q", cwd=proj)
        (proj / "base.exit.json").write_text(json.dumps({"returncode": r.returncode, "stderr": r.stderr}))

    proj = build_once(tmp_path_factory, "cpu-run", make)
    r = json.loads((proj / "base.exit.json").read_text())
    return proj, proj / "base", r["returncode"], r["stderr"]


@pytest.fixture(scope="session")
def shipped_cpu_run(tmp_path_factory):
    """The shipped CPU pipeline as it is, goal and all, run by a real `pipe` process from the
    repo's root: `pipe run PIPELINES/rmsnorm-cpu.yaml --run-dir RUN`: (the run folder, the
    CompletedProcess, its wall time in seconds). test_cli_e2e checks the run; test_report reports
    on it."""
    import time

    def make(d: Path) -> None:
        t0 = time.time()
        r = subprocess.run([*pipe_cmd(), "run", str(PIPELINES / "rmsnorm-cpu.yaml"), "--run-dir", str(d / "run")],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        (d / "exit.json").write_text(json.dumps({"args": r.args, "returncode": r.returncode, "stdout": r.stdout,
                                                 "stderr": r.stderr, "took": time.time() - t0}))

    d = build_once(tmp_path_factory, "shipped-cpu-run", make)
    r = json.loads((d / "exit.json").read_text())
    took = r.pop("took")
    return d / "run", subprocess.CompletedProcess(**r), took


H200_RUNS = {"softmax": ROOT / "tests" / "data" / "softmax-h200-run",
             "rmsnorm": ROOT / "tests" / "data" / "rmsnorm-h200-run",
             "cross_entropy": ROOT / "tests" / "data" / "cross-entropy-h200-run"}


def frozen_spec(run: Path) -> str:
    """The spec (with its template and profile) as it was when the run was made."""
    return str(next((run / "project" / "pipelines").glob("*.yaml")))


@pytest.fixture(scope="session")
def exported_h200(tmp_path_factory):
    """The three H200 runs of tests/data exported into one folder, each by `pipe export RUN
    --out FOLDER --spec` the spec it was made with: (the folder, {op: the export's
    CompletedProcess}). test_export and test_e2e import the packages."""

    def make(d: Path) -> None:
        done = {}
        for op, run in H200_RUNS.items():
            r = pipe_main("export", run, "--out", d / "packages", "--spec", frozen_spec(run), cwd=ROOT)
            done[op] = {"args": r.args, "returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr}
            if r.returncode != 0:
                break
        (d / "exports.json").write_text(json.dumps(done))

    d = build_once(tmp_path_factory, "exported-h200", make)
    done = json.loads((d / "exports.json").read_text())
    done = {op: subprocess.CompletedProcess(**r) for op, r in done.items()}
    return d / "packages", done


@pytest.fixture
def exported(exported_h200):
    """The folder of the three exported packages, each export checked: it ran, exited 0 and
    printed the table's rule (test_export, test_e2e)."""
    out, exports = exported_h200
    for op in H200_RUNS:
        r = exports.get(op)
        assert r is not None, f"not exported: {op} (an export before it failed)"
        assert r.returncode == 0, r.stderr[-3000:]
        assert "rule: a shape uses the kernel tuned for the same" in r.stdout
    return out


@pytest.fixture(scope="session")
def moe_specs():
    """name -> the MoE specs (tools/moe_spec.SPECS) loaded once for the run, each with its
    configurations listed once (`cfgs`: the space's constraints are checked over every shape,
    about 30 s for the five): the kernel's and the wgmma path's tests share them."""
    sys.path.insert(0, str(ROOT / "tools"))
    import moe_spec

    out = {}
    for name in moe_spec.SPECS:
        ms = moe_spec.load_moe_spec(ROOT / "pipelines" / name)
        ms.cfgs = [dict(c) for c in ms.spec.space]
        out[name] = ms
    return out
