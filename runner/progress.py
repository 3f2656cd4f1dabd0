"""Progress while a run goes: one line per trial with status and the best so
far; on a terminal, a live bar (rich) under those lines, and the log lines of
the run printed above it through the same Console (runner.core.log)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .core import log
from .core.records import Trial


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.2f} us"


def fmt_clock(c: dict | None) -> str:
    """A timing's SM clock summary (judge/clocks.py) where it ran below full clock, as
    ', at 1.68 GHz (low 1.65, 700 W, power cap)'; '' at full clock or where none was sampled."""
    if not c or not c.get("throttled"):
        return ""
    from .judge.clocks import describe

    return f", at {describe(c)}"


def fmt_params(p: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in p.items())


def trial_line(t: Trial, best: Trial | None, total: int | None) -> str:
    n = f"{t.id}/{total}" if total else f"{t.id}"
    mark = "*" if t.kept else " "
    head = f"[{n:>7}] {t.status:<13}{mark} {fmt_params(t.params)}"
    if t.status == "ok":
        head += f"  {fmt_time(t.objective)}"
        if t.metric is not None:
            head += f"  metric {t.metric:.4g}"
            ms = (t.details or {}).get("metric_spread")
            if ms is not None:
                head += f" ±{ms:.0%}"
        if (t.details or {}).get("same_kernels_as"):
            head += f"  (the same kernels as #{t.details['same_kernels_as']})"
    else:
        # the whole reason is in the ledger (`pipe show`); a long one is cut where it says so
        why = t.reason or ""
        head += f"  ({why if len(why) <= 320 else why[:319] + '…'})"
    if (t.details or {}).get("reused_from"):
        r = t.details["reused_from"]
        head += f"  (reused: {r['run']} #{r['trial']})"
    if (t.details or {}).get("slot"):  # a scaled-out run: the worker that judged it
        head += f"  @{t.details['slot']}" + (" (retried)" if t.details.get("retried_after") else "")
    if best is not None:
        head += f"  | best #{best.id} {fmt_time(best.objective)}"
    return head


class Reporter:
    def __init__(self, total: int | None, quiet: bool = False, live: bool | None = None):
        self.total = total
        self.quiet = quiet
        self.live = sys.stdout.isatty() if live is None else live
        self.console = Console(highlight=False, soft_wrap=True)
        self.bar = None
        if self.live and not quiet:
            self.bar = Progress(TextColumn("[bold]pipe"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.description}"),
                                console=self.console, transient=True)
            self.task = self.bar.add_task("", total=total)
            self.bar.start()
            log.set_live_console(self.console)  # log lines above the bar, whole

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.console.print(text, markup=False)
        else:
            print(text, flush=True)

    def trial(self, t: Trial, best: Trial | None, done: int) -> None:
        self.line(trial_line(t, best, self.total))
        if self.bar is not None:
            desc = f"best {fmt_time(best.objective)}" if best else ""
            self.bar.update(self.task, completed=done, description=desc)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
            log.set_live_console(None)
