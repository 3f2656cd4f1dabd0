"""Work that outlives the call (CPU backend): a thread census after every candidate call.

The CPU backend times a call by wall clock on the calling thread, so any work a kernel
leaves running when it returns is work the timer never sees: a thread handed the rows
and joined at the next call, a thread that finishes a moment after the return, a pool
of threads kept from an earlier call that goes on working between calls. The sandbox
(judge/sandbox.py) already leaves threads as the only way to run code outside the call:
no fork, no other process, no signal timers.

The rule: outside a call of the candidate, the worker runs no thread the judge did not
start. A kernel may start threads inside a call; it must have joined them before it
returns. After every call of candidate code (checked, warm-up, timed: outside the timed
region, the first thing after the call returns) the judge lists /proc/self/task (about
5 us); a thread that is not one of the judge's own (`base`: the main thread, the log
thread, torch's pool, listed before the request's first candidate call) and that is not
already exiting is a thread of the kernel still alive after the call: the verdict is
`wrong`, and the worker is restarted afterwards so that the thread dies with it.

A joined thread may still be listed for a few microseconds after the join returns (the
kernel clears its thread id, which wakes the joiner, before it finishes exiting): the
kernel marks it PF_EXITING before that, and such a thread runs no more user code, so it
is let through. A thread kept between calls is always listed.

What a listing cannot see is a thread that has ended by the time the listing runs. Where the
kernel runs in a kernel host (build/backends/cpu_host.py, the CPU backend on x86-64 Linux),
the judge's listing (`cpu_host.HostCensus`) comes only once the host is asleep again, tens
of microseconds after the return, and a thread handed the rows that finished by then was
never seen (the `deferred_thread` red-team kernel passed 4 runs of 4 alone on an idle
machine, session 44). So the host takes a census of its own threads first, at once after the
call returns, with nothing of its own before it but `done` (kernel_host._Census): the link
count of /proc/self/task, opened before the filter (2 and the threads, an exiting one
included; about 1 us). With more than the main thread, the host stops itself (SIGSTOP: every
thread not already exiting stops where it is) and the judge lists its threads and their
flags, as here, then continues it (cpu_host.Host._look_while_held): the host itself opens no
file, as a thread's flags sit beside its clocks in /proc. It writes one record a command (the
command's number, the threads alive but the main one) to a socket whose other end only the
judge holds, and the judge takes exactly one record for each command (Host._reported): a
thread alive and not exiting in the stopped process outlived its call, however soon it would
have ended after; a missing record, a second one, a message of another size, or a count with
no stop is the channel tampered with. The kernel can add records but never take one back,
and the filter keeps it from closing, replacing or shutting down the host's end
(judge/sandbox.py, `keep_fds`), so a forged "none" hides nothing. Left: a thread that ends
within the microseconds the host takes to see it (the return through ctypes, `done`, the
fstat and the stop: a few us in all), whose CPU time is charged to the call (the host's CPU
beyond its own path's, shared over its cores); and a kernel that rewrites the host's own code or data (the
interpreter's memory is its to write) so that the census is not taken or lies, which is a
different class (tampering with the host) from work left running. Where the worker runs the
kernel itself, this listing right after the return is the census: the thread that it misses
is one that does its last work in the few microseconds between the return and the listing
and has exited by then (and had to be started inside the call, tens of microseconds of the
timed call).
"""

from __future__ import annotations

import os

from ..build.backends.cpu_host import PF_EXITING, exiting

__all__ = ["Census", "PF_EXITING", "TASK"]  # (PF_EXITING: its home was here)

TASK = "/proc/self/task"


def _exiting(tid: str, task: str = TASK) -> bool:
    return exiting(tid, task)


def _names(tids: list[str]) -> str:
    """'tid name, ...' for a reason (the names are the threads' own: a diagnostic, nothing more)."""
    out = []
    for t in tids[:4]:
        try:
            with open(f"{TASK}/{t}/comm", "rb") as f:
                out.append(f"{t} {f.read().strip().decode(errors='replace')[:16]!r}")
        except OSError:
            out.append(t)
    return ", ".join(out) + (", ..." if len(tids) > 4 else "")


class Census:
    """The judge's own threads, and a check after candidate calls that no other is alive."""

    def __init__(self):
        self.enabled = os.path.isdir(TASK)
        self.base: set[str] = set()
        self.convicted: set[str] = set()  # kernel threads seen alive: never taken into `base`
        self.why: str | None = None
        self.rebase()

    def rebase(self) -> None:
        """Take the threads alive now as the judge's own (at a point where no candidate thread
        can be alive unseen: before a request's first candidate call, after a torch arm)."""
        if self.enabled:
            self.base = set(os.listdir(TASK)) - self.convicted

    def strays(self) -> list[str]:
        """Threads alive now that are neither the judge's nor exiting."""
        if not self.enabled:
            return []
        extra = set(os.listdir(TASK)) - self.base
        return sorted(t for t in extra if not _exiting(t)) if extra else []

    def check(self, what: str = "the call") -> str | None:
        """Right after a call of candidate code returns: the first finding, also kept in `why`."""
        if not self.enabled:
            return None
        stray = self.strays()
        if stray:
            self.convicted.update(stray)
            if self.why is None:
                self.why = (f"{len(stray)} thread(s) the kernel started ({_names(stray)}) were still running "
                            f"after {what} returned: work outside the timed call (a kernel must join its "
                            "threads before it returns)")
        return self.why

    def take(self) -> str | None:
        """The finding since the last take (None if none), cleared."""
        why, self.why = self.why, None
        return why
