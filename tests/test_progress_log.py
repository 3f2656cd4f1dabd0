"""Log lines and the live progress bar share a terminal: every log line printed while
the bar is live comes out whole, on a line of its own, never after the bar's text
on the bar's line (where the next refresh would overwrite it)."""

import contextlib
import io
import re
import sys

import pytest
import structlog
from rich.console import Console

from runner.core import log
from runner import progress
from runner.core.records import Trial

CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # cursor moves, erases, colours
LINE = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[(info|warning) *\] worker\.event +n=(\d+) token=tok\d\d$")


@contextlib.contextmanager
def terminal(monkeypatch):
    """One terminal-like stream for the bar (a forced-terminal rich Console) and stderr.
    (Set inside the test: pytest puts its own sys.stderr back between a fixture and the test.)"""
    saved = structlog.get_config()
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)
    monkeypatch.setattr(progress, "Console",
                        lambda **kw: Console(file=screen, force_terminal=True, width=100, **kw))
    monkeypatch.setattr(log, "_live", None, raising=False)  # and no bar left live after the test
    log.configure()
    try:
        yield screen
    finally:
        monkeypatch.undo()
        structlog.configure(**saved)


def _whole(out: str, token: str) -> str:
    """The log line ending in `token` (a regular expression), checked to be whole on the screen: it starts on a fresh
    line (after a newline, or after a carriage return and an erase of the line) and a
    newline ends it, with nothing of the bar on either side."""
    hits = list(re.finditer(rf"([^\n]*?)(\d{{4}}-\d\d-\d\dT[^\n]*?{token})([^\n]*)(\n|$)", out))
    assert len(hits) == 1, (token, [h.group(0) for h in hits])
    pre, line, post, end = hits[0].groups()
    head, cr, tail = pre.rpartition("\r")
    fresh = CSI.sub("", tail) == "" and (CSI.sub("", head) == "" or "\x1b[2K" in tail)
    assert fresh, f"{token}: written after {CSI.sub('', pre)!r} on the same line"
    assert post == "" and end == "\n", f"{token}: followed by {CSI.sub('', post)!r} on the same line"
    return line


def test_log_lines_stay_whole_while_the_bar_is_live(monkeypatch):
    with terminal(monkeypatch) as screen:
        rep = progress.Reporter(total=30, live=True)
        try:
            assert rep.bar is not None
            for i in range(30):
                if i % 3 == 0:
                    log.get().warning("worker.event", n=i, token=f"tok{i:02d}")
                else:
                    log.get().info("worker.event", n=i, token=f"tok{i:02d}")
                rep.trial(Trial(params={"B": i}, status="ok", objective=1e-5, id=i + 1), None, i + 1)
        finally:
            rep.close()
    out = screen.getvalue()
    assert "━" in out  # the bar was drawn: the test saw it live
    for i in range(30):
        m = LINE.match(_whole(out, f"token=tok{i:02d}"))
        assert m and int(m.group(2)) == i
    # the per-trial lines are whole too
    for i in range(30):
        _whole(out.replace(f"[{i + 1:>4}/30] ok", f"2000-01-01T00:00:00Z trial{i:02d}"),
               rf"trial{i:02d} +B={i}  10\.00 us")


def test_without_a_live_bar_logs_go_to_stderr(monkeypatch, capsys):
    with terminal(monkeypatch) as screen:
        log.get().info("worker.event", n=1, token="tok01")
        rep = progress.Reporter(total=3, live=False)
        assert rep.bar is None
        log.get().info("worker.event", n=2, token="tok02")
        rep.close()
    lines = screen.getvalue().splitlines()
    assert [LINE.match(ln).group(2) for ln in lines] == ["1", "2"]
    assert "tok" not in capsys.readouterr().out


def test_log_lines_stay_on_stderr_when_it_is_not_the_bars_terminal(monkeypatch):
    """stderr sent to a file while the bar is on the terminal: the logs stay in the file."""
    with terminal(monkeypatch) as screen:
        logfile = io.StringIO()
        monkeypatch.setattr(sys, "stderr", logfile)
        rep = progress.Reporter(total=3, live=True)
        try:
            log.get().info("worker.event", n=1, token="tok01")
        finally:
            rep.close()
    assert "tok01" in logfile.getvalue() and "tok01" not in screen.getvalue()


def test_a_failed_trials_line_keeps_the_verdicts_figures():
    # a wrong verdict's reason names the shape, the element and the figures: the line keeps
    # them (session 23's line stopped at "(first at "), and says where it cuts a longer one
    why = ("shape 46 {'B': 32, 'L': 32768}, timed calls: output 'out': 1 of 131072 elements outside "
           "atol=0.001 rtol=0.016 (first at flat index 48317: -0.001297 vs reference -0.000166069, "
           "allowed error 0.001); max abs error 0.027")
    line = progress.trial_line(Trial(params={"SPLIT": 512}, status="wrong", reason=why, id=40), None, 400)
    assert line.endswith(f"({why})")
    long = progress.trial_line(Trial(params={}, status="wrong", reason="x" * 500, id=1), None, None)
    assert long.endswith("x…)") and len(long) < 380
