"""Logs as events with keys (`trial.done`, `worker.fault`), through structlog:
readable on a terminal, one JSON object per line with --log-json."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(json_logs: bool = False, verbose: bool = False) -> None:
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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get():
    return structlog.get_logger("pipe")
