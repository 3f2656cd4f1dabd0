"""pipe report: a self-contained HTML page (plots as data URIs, no network) and a
markdown summary, from a run folder; rendered by headless Chromium."""

import base64
import io
import json
import re
import shutil
import subprocess

import pytest

from .conftest import ROOT, pipe_main

DATA = ROOT / "tests" / "data"


def _pipe(args, cwd):
    """The CLI's entry in this process (conftest.pipe_main); a run's judge is a worker process."""
    return pipe_main(*args, cwd=cwd)


@pytest.fixture
def cpu_run(shipped_cpu_run):
    """The shipped CPU pipeline's run (test_cli_e2e checks it), made once for the whole test run
    (conftest.shipped_cpu_run): reported on here, never changed."""
    run, r, _ = shipped_cpu_run
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
    # the plots' colours (bars, curves, markers) must be on screen: the plots were drawn, not
    # broken images, which show grey. Any saturated colour counts, not matplotlib's blue alone:
    # a run whose goal is met on its first trial has one blue point a plot and purple bars
    colour = ((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.3).sum()
    assert non_white > 0.05 and colour > 500, (non_white, colour)


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
    from runner.ledger.ledger import Ledger

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


def _figures(monkeypatch, run, spec=None):
    """The report's figures, kept open (matplotlib objects) instead of written as PNGs."""
    from runner.ship import report

    figs = []
    monkeypatch.setattr(report, "_png", lambda fig: (figs.append(fig), "iVBORw0KGgo=")[1])
    data = report.load(run, spec)
    rows = report.shape_rows(data)
    return data, figs, report.html_page(data, rows), report.markdown(data, rows)


def test_cpu_report_draws_no_roof_from_an_unmeasured_bandwidth(cpu_run, monkeypatch):
    """host-cpu's bandwidth is an upper bound, not a measurement (measured_by says so): points
    sat about 100x under a roof drawn from it. No line of any figure is that roof, and the
    report says why; each trial's achieved bandwidth is drawn instead."""
    import numpy as np

    data, figs, page, md = _figures(monkeypatch, cpu_run)
    hw = data["spec"].hw
    assert hw.name == "host-cpu"
    peak = hw.peak_flops(data["spec"].op.dtype) or hw.peak_flops("fp32")
    lines = [ln for f in figs for ax in f.axes for ln in ax.get_lines()]
    for ln in lines:
        x, y = np.asarray(ln.get_xdata(), float), np.asarray(ln.get_ydata(), float)
        assert not (len(x) > 2 and np.allclose(y, np.minimum(peak, x * hw.bandwidth))), ln.get_label()
        assert "TB/s" not in ln.get_label()
    assert not any(ax.get_xlabel().startswith("arithmetic intensity") for f in figs for ax in f.axes)
    bw = [ax for f in figs for ax in f.axes if ax.get_ylabel() == "achieved bandwidth (GB/s)"]
    assert len(bw) == 1 and bw[0].get_lines()  # the achieved bandwidth, per shape
    import html

    for text in (md, html.unescape(page)):
        assert "No roofline: the host-cpu profile's bandwidth" in text and "not measured" in text
    assert "<h2>Roofline</h2>" not in page and "<h2>Achieved bandwidth</h2>" in page
    assert not hw.bandwidth_measured


def test_h200_profile_bandwidth_is_measured(tmp_path):
    from runner.spec.hw import load_profile

    assert load_profile(ROOT / "hw_profiles" / "h200.yaml").bandwidth_measured
    assert load_profile(ROOT / "hw_profiles" / "h100.yaml").bandwidth_measured  # pipe hw's, session 47
    assert not load_profile(ROOT / "hw_profiles" / "host-cpu.yaml").bandwidth_measured
    text = (ROOT / "hw_profiles" / "h100.yaml").read_text()
    est = tmp_path / "h100-estimate.yaml"  # as it was before: an estimate from the datasheet
    est.write_text(re.sub(r"(?m)^  measured_by: .*$", "  measured_by: estimate (90% of datasheet)", text))
    assert est.read_text() != text and not load_profile(est).bandwidth_measured


@pytest.mark.parametrize("run", H200_RUNS, ids=[p.name for p in H200_RUNS])
def test_roofline_labels_do_not_overlap(run, tmp_path, monkeypatch):
    """On a measured profile the roofline is drawn, and none of its texts (the shapes' names,
    the roof's, the axes') overlaps another once drawn."""
    from matplotlib.text import Text

    work = tmp_path / "run"
    shutil.copytree(run, work)
    spec = next((run / "project" / "pipelines").glob("*.yaml"))
    data, figs, page, md = _figures(monkeypatch, work, str(spec))
    assert data["spec"] is not None and "No roofline" not in md and "<h2>Roofline</h2>" in page
    (fig,) = [f for f in figs if any(ax.get_xlabel().startswith("arithmetic intensity") for ax in f.axes)]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    shapes = [s["label"] for s in json.loads((work / "compare.json").read_text())["shapes"]]
    assert all(any(t.get_text() == s for t in texts) for s in shapes)  # every shape is named
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    overlaps = [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]
    assert not overlaps
    assert data["spec"].hw.bandwidth_measured
