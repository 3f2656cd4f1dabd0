"""pipe report: a self-contained HTML page (plots as data URIs, no network) and a
markdown summary, from a run folder; rendered by headless Chromium."""

import base64
import io
import json
import re
import shutil
import subprocess

import pytest

from .conftest import PIPELINES, ROOT, pipe_cmd

DATA = ROOT / "tests" / "data"


def _pipe(args, cwd, timeout=600):
    return subprocess.run(pipe_cmd() + args, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    run = d / "run"
    r = _pipe(["run", str(PIPELINES / "rmsnorm-cpu.yaml"), "--run-dir", str(run), "--max-trials", "5", "-q"], ROOT)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return run


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_report_is_self_contained_with_its_plots(cpu_run, tmp_path):
    r = _pipe(["report", str(cpu_run), "--out", str(tmp_path)], ROOT)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "report.html").read_text()
    imgs = _images(page)
    assert len(imgs) == 4  # progress, statuses, speedups, roofline
    assert all(i[:8] == b"\x89PNG\r\n\x1a\n" and len(i) > 5000 for i in imgs)
    # nothing fetched from anywhere: no scripts, links or remote sources
    assert not re.search(r"<script|<link|src=\"http|url\(", page)
    assert "512x4096" in page and "2048x1024" in page
    md = (tmp_path / "report.md").read_text()
    assert "| shape |" in md and "512x4096" in md and "vs baseline" in md


def test_report_on_an_empty_run_is_a_clear_error(tmp_path):
    r = _pipe(["report", str(tmp_path / "nothing")], ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def _chromium():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def _render(html_path, png_path):
    exe = _chromium()
    r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1300,2600", f"--screenshot={png_path}", html_path.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert png_path.is_file(), r.stderr[-2000:]
    import matplotlib.image as mpimg

    return mpimg.imread(io.BytesIO(png_path.read_bytes()), format="png")


def _check_rendered(px):
    rgb = px[..., :3]
    non_white = (rgb < 0.95).any(axis=-1).mean()
    # matplotlib's blue (bars and curves) must be on screen: the plots were drawn, not broken images
    blue = ((abs(rgb[..., 0] - 0.12) < 0.1) & (abs(rgb[..., 1] - 0.47) < 0.1) & (rgb[..., 2] > 0.6)).sum()
    assert non_white > 0.05 and blue > 500, (non_white, blue)


@pytest.mark.skipif(_chromium() is None, reason="needs Chromium (.ci/run installs it)")
def test_headless_chromium_renders_the_plots(cpu_run, tmp_path):
    r = _pipe(["report", str(cpu_run), "--out", str(tmp_path)], ROOT)
    assert r.returncode == 0, r.stderr
    _check_rendered(_render(tmp_path / "report.html", tmp_path / "shot.png"))


H200_RUNS = sorted(DATA.glob("*-h200-run")) if DATA.is_dir() else []


@pytest.mark.skipif(_chromium() is None, reason="needs Chromium (.ci/run installs it)")
@pytest.mark.parametrize("run", H200_RUNS, ids=[p.name for p in H200_RUNS])
def test_report_of_a_real_h200_run(run, tmp_path):
    """A run made on the H200 (ledger, compare.json), kept in tests/data: the report
    shows pipe compare's per-shape figures against every arm."""
    work = tmp_path / "run"
    shutil.copytree(run, work)
    spec = next((run / "project" / "pipelines").glob("*.yaml"))  # the spec as it was for the run
    r = _pipe(["report", str(work), "--out", str(tmp_path), "--spec", str(spec)], ROOT)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "report.html").read_text()
    cmp = json.loads((work / "compare.json").read_text())
    assert "NVIDIA H200" in json.dumps(cmp["machine"])
    for s in cmp["shapes"]:
        assert s["label"] in page
    assert "vs torch eager" in page and "vs triton" in page
    assert len(_images(page)) == 4  # with the run's spec: floors and the roofline too
    assert "kernel #" in page  # the dispatch column
    _check_rendered(_render(tmp_path / "report.html", tmp_path / "shot.png"))


def test_report_says_where_a_trials_time_went(cpu_run, tmp_path):
    """Each judged trial records its build (compiles), the judge's round trip and, inside the
    worker, verification and timing; the report gives their medians, and the parts fit in
    the whole."""
    from runner.ledger import Ledger

    trials = [t for t in Ledger.read(cpu_run).trials() if t.status == "ok"]
    assert trials
    for t in trials:
        d = t.details
        ph = d["judge_phases"]
        assert ph["verify_s"] > 0 and ph["time_s"] > 0
        assert ph["verify_s"] + ph["time_s"] <= d["judge_wall_s"] <= t.wall_s
        parts = ph["time_setup_s"] + ph["time_loop_s"] + ph["time_check_s"]
        assert ph["time_loop_s"] > 0 and ph["time_check_s"] > 0 and parts <= ph["time_s"] * 1.001
        assert d["build_wall_s"] <= t.wall_s
    r = _pipe(["report", str(cpu_run), "--out", str(tmp_path)], ROOT)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "report.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("Median time of a judged trial"))
    assert f"({len(trials)} trial" in line and "verification" in line and "timing" in line
    assert "timed loop" in line and "output checks" in line
