"""Logs as events with keys (`trial.done`, `worker.fault`), through structlog:
readable on a terminal, one JSON object per line with --log-json.

While a live progress bar is on screen (progress.Reporter on a terminal), a
log line written straight to stderr lands wherever the bar left the cursor,
at the end of the bar's line, and the next refresh overwrites it. So the bar
registers its rich Console here and, while it is live, each log line goes
through that Console's print, which clears the bar, writes the line whole and
draws the bar again below it (what rich does with its own prints). Logs go to
stderr as before whenever no bar is live, or when stderr is not the terminal
the bar is on (redirected to a file, say)."""

from __future__ import annotations

import logging
import sys
import threading

import structlog

_live = None  # the rich Console of the live progress bar, while there is one
_json = False  # whether log lines are JSON objects (--log-json), not lines for a person
_lock = threading.Lock()


def set_live_console(console) -> None:
    """Route log lines through `console` (the live bar's) until called again with None."""
    global _live
    _live = console


def _isatty(f) -> bool:
    try:
        return bool(f.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class LineLogger:
    """structlog's PrintLogger, but each line whole even under a live progress bar."""

    def msg(self, message: str) -> None:
        console = _live
        # stderr as the user gave it: rich swaps in a proxy of its own while a bar is live
        out = getattr(sys.stderr, "rich_proxied_file", sys.stderr)
        if console is not None and (console.file is out or (_isatty(out) and console.is_terminal)):
            from rich.text import Text

            console.print(Text.from_ansi(message), soft_wrap=True, highlight=False)
            return
        with _lock:
            out.write(message + "\n")
            out.flush()

    log = debug = info = warn = warning = err = error = critical = exception = fatal = failure = msg


def configure(json_logs: bool = False, verbose: bool = False) -> None:
    global _json
    _json = json_logs
    level = logging.DEBUG if verbose else logging.INFO
    processors = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json_logs:
        processors.append(structlog.processors.JSONRenderer(sort_keys=True))
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=lambda *args: LineLogger(),
        cache_logger_on_first_use=False,
    )


def for_machines() -> bool:
    """Whether the log is JSON (--log-json): a warning a progress line already showed a person
    is logged only then, so that a terminal does not show it twice."""
    return _json


def get():
    return structlog.get_logger("pipe")
