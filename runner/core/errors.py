"""One small error hierarchy.

`SpecError` carries every diagnostic found in an input file at once; the CLI
prints them as `file:line:col: key.path: message` and exits 2. Per-trial
failures are not exceptions of this kind: they are recorded statuses.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int  # 1-based
    col: int  # 1-based
    path: str  # dotted key path, "" for the document
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class PipeError(Exception):
    """Base of the errors pipe raises on purpose (bad input, bad state)."""


class SpecError(PipeError):
    """Invalid input; holds all diagnostics found."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = sorted(diagnostics, key=lambda d: (d.file, d.line, d.col, d.path))
        super().__init__("\n".join(str(d) for d in self.diagnostics))


class RunDirError(PipeError):
    """The run folder cannot be used (other spec, corrupt ledger)."""


class ExprError(PipeError):
    """A safe expression failed to parse or evaluate."""


class LedgerBroken(RunDirError):
    """The run folder's ledger failed its check (an edited, missing or forged row); the
    message names the first row that cannot be trusted. --force goes on anyway."""
