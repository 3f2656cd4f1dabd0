"""The judge's side of the kernel host (CPU backend): a candidate's library runs in a process of
its own (kernel_host.py beside this file), never in the worker.

Before, the CPU candidate was native code inside the worker, beside the timer, the reference's
copies, the sampled positions and the verdict pipe: any code there could in principle reach
them from memory (audit gap 13; the red team got a do-nothing kernel recorded at 472x). Now:

- **The arena.** Every buffer a candidate's arguments name (the inputs of a call, the outputs
  inside their guard bands, the scratch buffers) is allocated in one shared memory file,
  mapped by the worker and by each host. Nothing else of the worker is reachable from a host:
  the value sets waiting for later calls, the pristine copies, the snapshots, the references
  and the samples all live in the worker's private memory. A freed block's pages are punched
  out of the file (zeroed, returned), so no block shows a host what an earlier one held.
- **The host.** One process a library: `python -I -S kernel_host.py` with the arena's
  descriptor its only one (besides stdout and stderr, the worker's capped log), no capabilities,
  the seccomp filter (judge/sandbox.py) on before the library loads, with the calls that name
  a process allowed only on itself; it dies with the worker. The worker is not dumpable, so no
  host can read it through /proc.
- **The timing.** The judge's clock in the worker: PRIME has the host decode its arguments,
  `ack` and sleep on `go` (where its loop sleeps, calibrated); the judge reads the host's CPU
  time there, refreshes and flushes, wakes it to spin on `go`, starts its clock, writes `go`,
  and stops it when `done` comes back. `done` is the candidate's to write too: the call is
  charged at least the CPU the host spent from that sleep to its sleep after the call, beyond
  its own path's (Host.timed), and the CPU it spent before the sleep beyond its own path's.
- **What a host does between commands: nothing.** The host's CPU time (its process clock, which
  counts threads that have exited too) is read as each command ends and before the next is
  posted; more than IDLE_CPU_S between them (beyond one blip of up to IDLE_BLIP_S in the host's
  life) is work outside the timed call, and the verdict is `wrong`. After every call of candidate
  code the host counts its own threads at once, before anything else of its own runs, and
  reports the count on a socket only the judge reads (kernel_host._Census, Host._reported); the
  judge lists them too once the host is asleep (judge/threads.py): a kernel's thread still alive
  after its call is `wrong`.
- **A kernel that crashes** kills its host, not the worker: the trial's verdict is `fault`
  with the signal, and the worker goes on.

x86-64 Linux only (memfd, futexes, the filter); elsewhere the CPU backend runs candidates in the
worker, with the static rules alone.
"""

from __future__ import annotations

import bisect
import ctypes
import random
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

from . import kernel_host as kh

PAGE = 4096
HUGE = 2 << 20  # a shared-memory huge page, where the kernel may back the arena with them
PF_EXITING = kh.PF_EXITING  # set by the kernel as a thread starts to exit, before a join can return
SCRUB_BYTES = 1 << 20  # of the host's stack below the call, before every call (Runtime.SCRUB_BYTES)
ARENA_BYTES = 1 << 36  # virtual: the file is sparse, pages exist while a block holds them
IDLE_CPU_S = 10e-6  # CPU a host may spend between commands (0 in 1500 honest ones: asleep, it spends none)
# once in a host's life, up to this much between commands is forgiven (and the host watched from
# there): on a loaded two-core machine an honest host asleep in its loop was charged 177 and 291
# us between commands, once in a few thousand, cause not found (CI, sessions 40 and 41); a host
# that works for another's calls does so on every call it helps, and is caught at the second
IDLE_BLIP_S = 1e-3
START_TIMEOUT_S = 30.0
MAX_HOSTS = 32  # live at once; the oldest goes first
ACK_TIMEOUT_S = 10.0  # from a post to the host's `ack`: a kernel asleep inside its last call, never back
SETTLE_S = 1.0  # after `done`, the longest the host may take to be asleep again
SPIN_S = 50e-6
CALIBRATION_CALLS = 10  # with no library: the least of them is the host's own path
CALIBRATION_WARM = 3  # calls before them, not counted (9 counted from the first gave 2x outliers)
ARENA_EVERY = 8  # the arena's checks after one call in this many, at random (HostCensus.check)
# the least own-path CPU times calibrated in this process, by whether a flush ran between `ack`
# and `go` and by the entry's argument kinds (Host.calibrate): {"prime", "cpu", "main"}
_OWN: dict[tuple, dict[str, float]] = {}
PRIME_SLACK_S = 5e-6  # at least, beyond the least of the host's own path to its sleep on `go`
# beyond the calibrated spread: what a kernel that streams through memory costs the next call's
# stack scrub (its lines evicted; a calibrating call evicts nothing): up to about 37 us measured
# for a 32 MiB kernel, so work hidden before `go` by code that sleeps where the loop sleeps is
# charged beyond this much
EARLY_ALLOW_S = 40e-6
CPU_SLACK_S = 4e-6  # the host's own path around a call varies by about this much in CPU time (more after a kernel that evicts its lines)
GAP_SLACK_S = 50e-6  # the allowance for the gap after `done`: twice the host's own, and this  # the judge's tight spin on `done` before it starts yielding its core
FALLOC_PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
PR_SET_DUMPABLE = 4


class HostDied(RuntimeError):
    """The host exited (a kernel's crash): the trial's verdict is a fault."""


def supported() -> bool:
    import platform

    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64") and hasattr(os, "memfd_create")


def _shmem_small_pages() -> bool:
    """True where shared memory comes in 4 KiB pages only (no transparent huge pages for it)."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text()
    except OSError:
        return False
    return "[never]" in mode or "[deny]" in mode


def _cpu_clock(pid: int) -> int:
    """The clock id of a process's CPU time (MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED))."""
    return ((~pid) << 3) | 2


class Arena:
    """The shared memory file and its allocator (first fit over page-rounded blocks)."""

    def __init__(self, size: int = ARENA_BYTES):
        self.size = size
        self.fd = os.memfd_create("pipe-arena", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.mm = mmap.mmap(self.fd, size)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        self.free = [(0, size)]  # (offset, bytes), sorted, coalesced
        self.used: dict[int, int] = {}  # offset -> bytes (page-rounded) of each live block
        self.sizes: dict[int, int] = {}  # offset -> the bytes asked for (the rest is slack, kept zero)
        self.granule = PAGE if _shmem_small_pages() else HUGE
        self.lock = threading.Lock()
        libc = ctypes.CDLL(None, use_errno=True)
        self._fallocate = libc.fallocate
        self._fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]

    def alloc(self, nbytes: int) -> int:
        # a page past the end of every block: a kernel's vector loads that read a little past its
        # buffer land in its block's span, not in free space (a read there faults a page in)
        n = (nbytes + PAGE - 1) // PAGE * PAGE + PAGE
        with self.lock:
            for i, (off, size) in enumerate(self.free):
                if size >= n:
                    self.free[i:i + 1] = [(off + n, size - n)] if size > n else []
                    self.used[off] = n
                    self.sizes[off] = nbytes
                    return off
        raise MemoryError(f"the kernel host's arena is full ({self.size >> 30} GiB)")

    def release(self, off: int, nbytes: int) -> None:
        n = (nbytes + PAGE - 1) // PAGE * PAGE + PAGE
        self._fallocate(self.fd, FALLOC_PUNCH, off, n)  # zeroed and given back
        with self.lock:
            self.used.pop(off, None)
            self.sizes.pop(off, None)
            self.free.append((off, n))
            self.free.sort()
            merged = []
            for o, s in self.free:
                if merged and merged[-1][0] + merged[-1][1] == o:
                    merged[-1] = (merged[-1][0], merged[-1][1] + s)
                else:
                    merged.append((o, s))
            self.free = merged

    def stray_data(self) -> int | None:
        """The first byte offset of data in the file outside every live block (to the granule
        the file's pages come in), or None: a candidate writes its own buffers only, and the
        arena's free space (tens of GiB, mapped in every host) would otherwise keep whatever a
        kernel left there across calls, hosts and trials (the red team's memo, session 31)."""
        g = self.granule
        with self.lock:
            spans = sorted((o // g * g, -(-(o + n) // g) * g) for o, n in self.used.items())
        covered: list[list[int]] = []
        for a, b in spans:
            if covered and a <= covered[-1][1]:
                covered[-1][1] = max(covered[-1][1], b)
            else:
                covered.append([a, b])
        pos = 0
        while pos < self.size:
            try:
                d = os.lseek(self.fd, pos, os.SEEK_DATA)
            except OSError:
                return None  # no data past pos
            h = os.lseek(self.fd, d, os.SEEK_HOLE)
            i = bisect.bisect_right(covered, [d, float("inf")]) - 1
            if i < 0 or not (covered[i][0] <= d and h <= covered[i][1]):
                # the part of [d, h) that no block covers
                return d if i < 0 or d >= covered[i][1] else covered[i][1]
            pos = h
        return None

    def slack_written(self) -> int | None:
        """The first byte offset past a live block's own bytes (in its last page or the slack page
        after it) that is not zero, or None: a kernel reads past its buffers at most, and a
        write there would keep state for as long as the block lives (the third red-team pass)."""
        with self.lock:
            spans = [(o + self.sizes[o], o + n) for o, n in self.used.items()]
        for a, b in spans:
            if b > a:
                tail = self.mm[a:b]
                if tail.count(0) != len(tail):
                    return a + next(i for i, c in enumerate(tail) if c)
        return None

    def clean_slack(self) -> None:
        """Every live block's bytes past its own (its last page's rest and the slack page) zero."""
        with self.lock:
            spans = [(o + self.sizes[o], o + n) for o, n in self.used.items()]
        for a, b in spans:
            if b > a:
                self.mm[a:b] = bytes(b - a)

    def punch_free(self) -> None:
        """Every free range punched out (zero, no pages): what any kernel left there is gone."""
        with self.lock:
            free = list(self.free)
        for off, n in free:
            self._fallocate(self.fd, FALLOC_PUNCH, off, n)

    def block(self, nbytes: int):
        """(offset, a ctypes array over the block): the block is released when the array and
        every tensor made over it are gone."""
        off = self.alloc(nbytes)
        arr = (ctypes.c_char * max(1, nbytes)).from_buffer(self.mm, off)
        weakref.finalize(arr, self.release, off, nbytes)
        return off, arr

    def tensor(self, like):
        """A tensor in the arena with `like`'s shape, dtype and values (contiguous)."""
        import torch

        nbytes = like.numel() * like.element_size()
        if nbytes == 0:
            return torch.empty_like(like, memory_format=torch.contiguous_format)
        _, arr = self.block(nbytes)
        t = torch.frombuffer(arr, dtype=like.dtype, count=like.numel()).view(like.shape)
        t.copy_(like)
        return t

    def holds(self, addr: int, nbytes: int = 1) -> bool:
        return self.base <= addr and addr + nbytes <= self.base + self.size


class Host:
    """One kernel host: a process with one library loaded, and its control block."""

    def __init__(self, arena: Arena, artifact: str, entry: str, kinds: list[str], census: "HostCensus",
                 threads: int | None = None, between=None):
        """`threads`: the cores the host's calls may run on (runtime.threads: torch's arms get as
        many), kept off the judge's own where the machine has more."""
        self.arena, self.kinds, self.census = arena, list(kinds), census
        # what the judge does between a call's `ack` and its `go` (its cache flush), done in
        # calibration too, so that the host's own path is measured as a timed call meets it
        self._between = between
        self._at_go, self.primed_cpu, self.go_where = (0.0, 0.0), 0.0, None
        if len(kinds) > kh.MAX_ARGS:
            raise ValueError(f"a kernel takes at most {kh.MAX_ARGS} arguments here")
        # the control block: a file of this host's own, mapped here and in the host only. In the
        # arena, which every host of a request maps, a kernel could read a rival's command count
        # (its place in a round), and rouse a rival asleep on its command word with a shared wake
        # the filter never sees: the kernel's own write and wake of a thread's exit (its
        # clear_child_tid, set by set_tid_address or clone, or a robust futex) pointed at that
        # word (session 65's red team: the rival took a command the judge never posted and hung)
        self._ctl_fd = os.memfd_create("pipe-host-ctl", os.MFD_CLOEXEC)
        os.ftruncate(self._ctl_fd, kh.CTL_BYTES)
        self._ctl_mm = mmap.mmap(self._ctl_fd, kh.CTL_BYTES)
        self.ctl_addr = addr = ctypes.addressof(ctypes.c_char.from_buffer(self._ctl_mm))
        self.u32 = (ctypes.c_uint32 * (kh.CTL_BYTES // 4)).from_address(addr)
        self.u64 = (ctypes.c_uint64 * (kh.CTL_BYTES // 8)).from_address(addr)
        self.kind_bytes = (ctypes.c_uint8 * kh.MAX_ARGS).from_address(addr + kh.KINDS_AT)
        self._seq_p = ctypes.c_void_p(addr + kh.SEQ)
        self._go_p = ctypes.c_void_p(addr + kh.GO)
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        sandbox_py = str(Path(__file__).resolve().parents[2] / "judge" / "sandbox.py")
        self.seq = self.u32[kh.SEQ // 4] = 1  # the host answers it with `done` once it is set up
        # the census socket: the host writes a record after every command (kh.REPORT), and only
        # this end reads them; a datagram a record (SEQPACKET), so no write of the kernel's can
        # run into the host's, and nonblocking at both ends (a host never waits on it)
        self._report, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._report.setblocking(False)
        theirs.setblocking(False)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", kh.__file__, str(arena.fd), str(arena.size), str(self._ctl_fd),
                 str(os.getpid()), sandbox_py, str(theirs.fileno())],
                stdin=subprocess.DEVNULL, pass_fds=(arena.fd, self._ctl_fd, theirs.fileno()), close_fds=True)
        except BaseException:
            self._report.close()
            raise
        finally:
            theirs.close()
            os.close(self._ctl_fd)  # (the mapping stays)
        self.pid = self.proc.pid
        self._stat = os.open(f"/proc/{self.pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._schedstat = os.open(f"/proc/{self.pid}/task/{self.pid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._schedstat = None
        try:
            self._cpus = sorted(os.sched_getaffinity(self.pid))
        except OSError:
            self._cpus = []
        # the cores its calls run on (runtime.threads of them, off the judge's where there are
        # more; chosen once: a host moved from core to core pays for it in CPU time): the CPU a
        # call spends, shared over them, is a time it took at least
        want = max(1, int(threads or len(self._cpus) or 1))
        if 0 < want < len(self._cpus):
            here = self._libc.sched_getcpu()
            use = ([c for c in self._cpus if c != here] or self._cpus)[:want]
            try:
                os.sched_setaffinity(self.pid, use)
                self._cpus = use
            except OSError:
                pass
        self.cores = max(1, min(want, len(self._cpus) or want))
        self.cpu_bound_used = False  # whether the last timed call's figure came from its CPU time
        self._task = f"/proc/{self.pid}/task"
        self.clock = _cpu_clock(self.pid)
        self.loop_where = None  # (calibrate)
        self.blipped = False  # CPU between commands forgiven once (idle_problem)
        self.pending, self.pending_words = None, None  # a primed call's seq and arguments
        self._wait(1, START_TIMEOUT_S, "starting")
        self._settle()
        self.confined = self.u32[kh.STATUS // 4] == 1
        self.host_base = int(self.u64[kh.ARGS_AT // 8])  # the arena's address in the host
        self.host_ctl = int(self.u64[kh.ARGS_AT // 8 + 1])  # and its control block's
        self.scrub_bytes = SCRUB_BYTES
        self.nargs = len(kinds)
        for i, k in enumerate(kinds):
            self.kind_bytes[i] = kh.KIND_CODES[k]
        # calibrated calls decode, convert and pass the entry's arguments (to a stand-in that
        # ignores them): the host's own path as a call of this entry takes it
        self.command(kh.STAND_IN)
        self.calibrate()
        text = artifact.encode() + b"\0" + entry.encode() + b"\0"
        ctypes.memmove(addr + kh.TEXT_AT, text, len(text))
        for i, k in enumerate(kinds):
            self.kind_bytes[i] = kh.KIND_CODES[k]
        self.command(kh.LOAD)
        if self.u32[kh.STATUS // 4] != 0:
            why = bytes((ctypes.c_char * kh.TEXT_BYTES).from_address(addr + kh.TEXT_AT)).split(b"\0")[0]
            self.close()
            raise OSError(f"the kernel host could not load {artifact}: {why.decode(errors='replace')[:400]}")

    # -- the protocol -------------------------------------------------------------
    def _cpu(self) -> float:
        try:
            return time.clock_gettime(self.clock)
        except OSError:
            return float("inf")

    def _switched_out(self) -> bool:
        """The host's main thread has left its CPU: reading its /proc syscall file makes the kernel
        wait until it is off the CPU (wait_task_inactive) and says "running" where it woke instead.
        Only then is the process's CPU time exact: another process's thread still on a CPU has its
        clock standing at its last tick or switch, so state S and two equal readings do not mean it
        has stopped (on a loaded two-core VM an honest host seen so while still switching out was
        charged its whole call, 60 us to 2.4 ms, as CPU time between calls). Unreadable: True (the
        readings alone decide, as before)."""
        parts = self._syscall()
        return parts is None or parts[:1] != [b"running"]

    def _state(self) -> bytes:
        """The host's main thread's scheduler state (R running, S asleep, ...; b"" once gone)."""
        try:
            stat = os.pread(self._stat, 1024, 0)
        except OSError:
            return b""
        return stat[stat.rindex(b")") + 2:][:1] if stat else b""

    def _asleep(self) -> bool:
        """The host's main thread asleep in a wait of its own (S), or gone (Z, X, b""). Not D: a
        thread in uninterruptible sleep is waiting inside a page fault or an I/O on its way
        somewhere, and what it spends when that ends is not yet counted: an honest host seen so
        between its `done` and its loop's wait (a page fault under memory pressure) would be
        charged the rest of that way as CPU time between calls, and `wrong`."""
        return self._state() in (b"S", b"Z", b"X", b"")

    def _settle(self) -> float:
        """After `done`: until the host is asleep again (a few microseconds of its own loop), then
        its CPU time, exact now (a running thread's time is counted only up to its last tick).
        The moment it was seen asleep is returned."""
        # asleep, and off the CPU: the state reads S from the moment the thread starts to sleep,
        # before the switch that counts its last stretch of CPU time (up to a tick's worth, 169
        # and 180 us on an honest kernel, first try): the thread must be off its CPU
        # (_switched_out), and two equal readings of the clock in a row follow
        # and the kernel's joined threads gone (a join returns before the thread has finished
        # exiting, whose last work is counted when it is gone: 102 us once on 2 threads)
        t0 = time.perf_counter()
        prev = None
        # the command's hold (kernel_host._Census.hold): whether the host stopped itself for a
        # listing, the threads then alive but its main one and not exiting, and whether it stopped
        # with no record asking for it; the census socket's messages for this command
        self.held, self.held_strays, self.stopped_itself = False, 0, False
        self._recs, self._closed = [], False
        while True:
            t = time.perf_counter()
            if self._state() in (b"T", b"t"):
                self._look_while_held()
                continue
            if self._asleep() and self._alone() and self._switched_out():
                c = self._cpu()
                if c == prev:
                    break
                prev = c
            else:
                prev = None
            if t - t0 > SETTLE_S:
                self.census.note(f"the kernel's process was still running {SETTLE_S:g} s after its call "
                                 "returned: work outside the timed call")
                prev = self._cpu()
                break
            os.sched_yield()  # the host may be waiting for this core to go back to sleep
        self.cpu_after = prev
        where = self._where() if self.loop_where is not None else None
        if self.loop_where is not None and where != self.loop_where and self.proc.poll() is None:
            self.census.note(f"the kernel's process was asleep inside its call (system call "
                             f"{where[0] if where else 'none'}) when "
                             "the call said it was done: its work could go on with the next command, untimed")
        self._reported()
        self.census.watch(skip=self)  # the others slept through this one's call
        return t

    def _look_while_held(self) -> None:
        """The host stopped (its census found threads besides its main one and wrote its record
        first, kernel_host._Census.hold): every thread of it not already exiting is stopped where
        it was, so none can finish its work and leave before it is seen. Its threads listed with
        their flags (the host itself may open no file: /proc's hold clocks), then it goes on. A
        stop with no such record before it is the kernel's own (a stop the judge took for the
        census's would let a later one be cancelled unseen: session 65's red team)."""
        self._drain()
        if any(q == self.seq and c for q, c in self._records()):
            self.held = True
            try:
                others = [t for t in os.listdir(self._task) if t != str(self.pid)]
            except OSError:
                others = []
            self.held_strays = max(self.held_strays, sum(not exiting(t, self._task) for t in others))
        elif not self.stopped_itself:
            self.stopped_itself = True
            self.census.note("the kernel's process stopped itself after its call with no census record asking for "
                             "it (SIGSTOP): a kernel's own stop, to be taken for the census's")
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def _drain(self) -> None:
        """The census socket's waiting messages into self._recs (self._closed: its channel closed)."""
        while True:
            try:
                b = os.read(self._report.fileno(), 64)  # (a longer datagram comes back cut: not a record)
            except BlockingIOError:
                return
            except OSError:
                self._closed = True
                return
            if not b:
                self._closed = True  # every write end gone (or shut down)
                return
            self._recs.append(b)

    def _records(self) -> list[tuple[int, int]]:
        return [kh.REPORT.unpack(b) for b in self._recs if len(b) == kh.REPORT.size]

    def _reported(self) -> None:
        """The host's own census of the command just settled (kernel_host._Census: its threads
        but the main one, counted at once after a call returned; with any, it stopped itself and
        the judge listed them, _look_while_held): a thread then alive and not exiting outlived its
        call, however soon it ended after. Exactly one record, for this command: the host is
        asleep in its loop by now, so its record was written; the kernel can add records (forged
        ones: more than one), not take one away, and cannot close or replace the host's end. Any
        other tally is the channel written to or broken by the kernel, and a count with no stop
        the host continued by something else."""
        self._drain()
        recs, closed = self._recs, self._closed
        if self.held_strays:
            self.census.convicted.add(f"{self.pid}/census")
            self.census.note(f"{self.held_strays} thread(s) the kernel started were still running after the call "
                             "returned (its process counted them at once and stopped for the judge to list them): "
                             "work outside the timed call (a kernel must join its threads before it returns)")
        if self.proc.poll() is not None:
            return  # died: the death is the finding (HostDied at the next wait)
        ours = [c for q, c in self._records() if q == self.seq]
        if not closed and len(recs) == 1 and len(ours) == 1:
            if ours[0] and not self.held:
                self.census.note("the kernel's process counted threads besides its main one after the call, and went "
                                 "on before the judge had listed them (something else continued it): work outside the "
                                 "timed call could have gone unseen")
            return
        if not self.held_strays:  # (with one, the finding above says it)
            self.census.note(f"the kernel's process did not report its thread census once for the command "
                             f"({len(ours)} records of it, {len(recs)} messages in all"
                             f"{', its channel closed' if closed else ''}): the kernel wrote to or broke the channel, "
                             "so a thread of its could have outlived the call unseen (work outside the timed call)")

    def _alone(self) -> bool:
        """No thread in the host but its main one, or one that is not exiting (the census's to
        judge: waiting for it would be waiting for nothing); while another is still exiting,
        False."""
        try:
            others = [t for t in os.listdir(self._task) if t != str(self.pid)]
        except OSError:
            return True
        return not others or any(not exiting(t, self._task) for t in others)

    def idle_problem(self) -> str | None:
        """Why this host is not idle as it should be between its commands (running now, or CPU
        time spent since its last command ended), or None; a host that is gone is idle."""
        if self.proc.poll() is not None or self.pending is not None:
            return None  # gone, or primed (scrubbing, then spinning on `go`)
        running = self._state() == b"R"
        now = self._cpu()
        idle = now - self.cpu_after
        if running or idle > IDLE_CPU_S:
            if not self.blipped and idle <= IDLE_BLIP_S:
                self.blipped = True  # forgiven once (IDLE_BLIP_S); watched from here
                self.cpu_after = now
                return None
            return (f"the kernel's process ran between calls ({idle * 1e6:.0f} us of CPU; at most "
                    f"{IDLE_CPU_S * 1e6:.0f} us, asleep, and {IDLE_BLIP_S * 1e6:.0f} us once): work outside "
                    "the timed call")
        return None

    def _post(self, cmd: int, watch: bool = True) -> int:
        """Post a command; first, every host (this one and any other of the request, which could
        work for this one's call: the red team's second pass) must be asleep with no CPU time
        spent since its last command ended. The block's words the host reads for it are the
        judge's again (the kernel may have written them)."""
        if watch:
            self.census.watch()
        self.u64[kh.SCRUB_BYTES_AT // 8] = self.scrub_bytes
        self.u32[kh.NARGS // 4] = self.nargs
        self.u32[kh.CMD // 4] = cmd
        self.seq = (self.seq + 1) & 0xFFFFFFFF
        self.u32[kh.SEQ // 4] = self.seq
        self._libc.syscall(ctypes.c_long(kh.SYS_FUTEX), self._seq_p, kh.FUTEX_WAKE, kh.WAKE_ALL, None, None, 0)
        return self.seq

    def _wait(self, s: int, timeout: float | None = None, what: str = "a call", word: int = kh.DONE) -> float:
        """Until the host writes `s` to `word` (a tight spin, then a spin that yields the core, as a
        kernel's threads may need every core, then short sleeps; the host's death ends it); the
        moment it was seen."""
        u32, i = self.u32, word // 4
        t0 = time.perf_counter()
        while u32[i] != s:
            dt = time.perf_counter() - t0
            if dt < SPIN_S:
                os.sched_yield()
                continue
            if self.proc.poll() is not None:
                if u32[i] == s:
                    break
                raise HostDied(self._death(what))
            if timeout is not None and dt > timeout:
                raise HostDied(f"the kernel host did not answer within {timeout:g} s while {what}")
            if dt >= 0.05 and self._state() in (b"T", b"t"):  # (only the kernel stops it before it answers)
                raise HostDied(f"the kernel's process stopped itself (SIGSTOP) while {what}")
            os.sched_yield() if dt < 0.05 else time.sleep(1e-4)
        return time.perf_counter()

    def _death(self, what: str) -> str:
        how = exit_text(self.proc.returncode)
        return f"the kernel's process died during {what} ({how})"

    def command(self, cmd: int) -> None:
        self._wait(self._post(cmd))
        self._settle()

    def set_args(self, words: list[int]) -> None:
        for i, w in enumerate(words):
            self.u64[kh.ARGS_AT // 8 + i] = w

    def prime(self, words: list[int]) -> None:
        """Wake the host for a call on `words` and wait for its `ack` (it has scrubbed and
        decoded them) and its sleep on `go`: the judge refreshes the inputs and flushes the caches
        only after it, so nothing a kernel does before its host acknowledges (woken by the post,
        it could have slept inside its last call: session 31's third red-team pass) can depend
        on the inputs of the call to come, and the host's CPU time is exact there
        (`primed_cpu`: what it spent since its last command). A call primed on other arguments
        is called off first."""
        if self.pending is not None:
            if self.pending_words == words:
                return
            self._abort()
        self.set_args(words)
        self.census.watch()
        before = self.cpu_after  # exact: the host asleep since its last command (and idle: watch)
        s = self._post(kh.PRIME, watch=False)
        self._wait(s, ACK_TIMEOUT_S, "waking for a call", word=kh.ACK)
        # asleep on `go` before the judge refreshes and flushes (its CPU time exact then); what
        # it spent since its last command is its own path's, unless code of the candidate's ran
        # in it (the interpreter is the candidate's to reach: session 37's second red team
        # worked a whole call out there, before `go`): the excess is charged to a timed call
        self._at_go = self._asleep_on_go()
        self.primed_cpu = self._at_go[0] - before
        self.pending, self.pending_words = s, list(words)

    def _abort(self) -> None:
        s, self.pending = self.pending, None
        self.u32[kh.GO // 4] = s ^ kh.ABORT
        self._libc.syscall(ctypes.c_long(kh.SYS_FUTEX), self._go_p, kh.FUTEX_WAKE, kh.WAKE_ALL, None, None, 0)
        self._wait(s)
        self._settle()

    def run(self, words: list[int]) -> None:
        """An untimed call (verification, warm-up, checks): primed, then run."""
        self._primed(words)

    def _primed(self, words: list[int]) -> tuple[float, float, float, float, float]:
        """One primed call (primed here unless it is already): (go, done, asleep) on the judge's
        clock, and the CPU time the host spent from its sleep after `ack` to its sleep after the
        call: the whole process's, and its main thread's. The host is woken first and spins on
        `go` (`started`), so its wake-up is not timed; a host that shares the judge's core then
        delays `done` as the judge sees it, which only lengthens the time."""
        self.prime(words)
        s, self.pending = self.pending, None
        u32 = self.u32
        c0, m0 = self._at_go  # (anything the host does from here on is the call's CPU time)
        u32[kh.STARTED // 4] = 0
        u32[kh.GO // 4] = s ^ kh.WAKE
        self._libc.syscall(ctypes.c_long(kh.SYS_FUTEX), self._go_p, kh.FUTEX_WAKE, kh.WAKE_ALL, None, None, 0)
        # bounded: a `go` word written ahead by another host's kernel (the arena holds every
        # host's control block) leaves this host aborted, never started (session 38's red team)
        self._wait(s, ACK_TIMEOUT_S, "starting a call", word=kh.STARTED)
        t_go = time.perf_counter()
        u32[kh.GO // 4] = s
        t_done = self._wait(s)
        t_sleep = self._settle()
        # (the host reads it after `done`: asleep again now, it has written STATUS)
        if u32[kh.STATUS // 4] == kh.FENV_CHANGED:
            self.census.note("fast_math: the kernel left the floating-point control state changed when its call "
                             "returned (MXCSR's flush-to-zero, denormals-are-zero or rounding bits, or the x87 "
                             "control word), by whatever route it set it")
        return t_go, t_done, t_sleep, self.cpu_after - c0, self._main_cpu() - m0

    def _asleep_on_go(self) -> tuple[float, float]:
        """Once the primed host sleeps on `go` (its CPU time is exact then: a running process's,
        read from here, lags by up to a scheduler tick): (its CPU time, its main thread's). It
        must sleep where its loop does (the futex on `go`, at the place calibrated before the
        library loaded), else code of the candidate's sleeps there in its stead."""
        t0 = time.perf_counter()
        prev = None
        while True:
            if self._asleep() and self._alone() and self._switched_out():
                c = (self._cpu(), self._main_cpu())
                if c == prev:
                    if self.go_where is not None and self._where() != self.go_where and self.proc.poll() is None:
                        self.census.note("the kernel's process slept somewhere other than its loop's wait for "
                                         "`go`: code of the candidate's ran outside its call")
                    return c
                prev = c
            else:
                prev = None
            if self.proc.poll() is not None:
                raise HostDied(self._death("waiting for a call"))
            if time.perf_counter() - t0 > ACK_TIMEOUT_S:
                raise HostDied(f"the kernel host did not sleep on `go` within {ACK_TIMEOUT_S:g} s")
            os.sched_yield()

    def _main_cpu(self) -> float:
        """The host's main thread's CPU time (its schedstat; exact while it sleeps), or 0 where
        it cannot be read (the whole process's then stands alone)."""
        if self._schedstat is None:
            return 0.0
        try:
            return int(os.pread(self._schedstat, 64, 0).split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            return 0.0

    def _syscall(self) -> list[bytes] | None:
        """The fields of /proc/<pid>/syscall for the host's main thread ("running" where it is on a
        CPU; the kernel answers a sleeping thread's only once it is off its CPU), or None where the
        file cannot be read."""
        try:
            with open(f"/proc/{self.pid}/syscall", "rb") as f:
                return f.read().split()
        except OSError:
            return None

    def _where(self) -> tuple | None:
        """Where the host's main thread sleeps: (system call, its first argument, stack pointer,
        program counter) from /proc/<pid>/syscall, or None (running, gone, or not readable)."""
        parts = self._syscall()
        if parts is None or len(parts) < 9 or not parts[0].isdigit():
            return None
        return int(parts[0]), int(parts[1], 16), int(parts[7], 16), int(parts[8], 16)

    def calibrate(self) -> None:
        """With no library loaded yet: how long this host takes from `done` to asleep, and where
        its loop sleeps between commands (the futex on its command word, at one stack pointer and
        one program counter), with nothing of a candidate's in it. A timed call whose own gap after
        `done` is longer is charged the excess, and after every command the host must be asleep
        exactly there (`_settle`)."""
        downs, wheres, cpus, mains, primes, gos = [], set(), [], [], [], set()
        for i in range(CALIBRATION_WARM + CALIBRATION_CALLS):
            self.prime([0] * self.nargs)
            if i < CALIBRATION_WARM:  # a fresh interpreter's first calls (its caches cold): not its own path's
                if self._between is not None:
                    self._between()
                self._primed([0] * self.nargs)
                continue
            gos.add(self._where())
            primes.append(self.primed_cpu)
            if self._between is not None:  # what the judge does there for a timed call (a cache flush)
                self._between()
            _, t_done, t_sleep, cpu, main = self._primed([0] * self.nargs)
            downs.append(t_sleep - t_done)
            cpus.append(cpu)
            mains.append(main)
            wheres.add(self._where())
        go = gos.pop() if len(gos) == 1 else None
        self.go_where = go if go is not None and go[:2] == (kh.SYS_FUTEX, self.host_ctl + kh.GO) \
            else None
        # the host's own path from one command's end to its sleep on `go` (woken, the stack
        # scrubbed, the arguments decoded, `ack`): its least, and room for its spread
        primes.sort()
        self.prime_slack = max(PRIME_SLACK_S, primes[len(primes) // 2] - primes[0])
        # the least over every host this process calibrated the same way: a host started while
        # the machine was busy reads its own path high, and a kernel could hide the difference
        least = _OWN.setdefault((self._between is None, tuple(self.kinds)), {})
        least["prime"] = self.prime_own = min(least.get("prime", primes[0]), primes[0])
        # the fastest (a busy machine's preemptions inflate the rest, and with them what a kernel
        # could hide); an honest call preempted in the gap is charged, and the median of the
        # timed calls leaves it out
        self.down_allow = 2 * min(downs) + GAP_SLACK_S
        # the CPU the host's own path takes around a call (the least of the calibration's: CPU
        # time is not inflated by preemption, and a kernel may hide no more than the difference)
        least["cpu"] = self.cpu_own = min(least.get("cpu", min(cpus)), min(cpus))
        least["main"] = self.main_own = min(least.get("main", min(mains)), min(mains))
        seq_here = self.host_ctl + kh.SEQ
        loop = wheres.pop() if len(wheres) == 1 else None
        self.loop_where = loop if loop is not None and loop[:2] == (kh.SYS_FUTEX, seq_here) else None

    def timed(self, words: list[int]) -> float:
        """One timed call on `words`: the host primed and spinning, then the judge's clock from `go` to
        `done`. `done` is in the host's memory, so a kernel can write it and work on: the gap from
        `done` to the host asleep again, beyond the host's own (`calibrate`), is added to the
        time; and a kernel that sleeps inside its call, to finish on the next post, is asleep
        somewhere other than the host's loop (`_settle`). The gap from the post to `ack` is not
        charged: it is mostly the host's wake-up (3 to 4 ms after 20 ms idle on a 2-core VM)."""
        t_go, t_done, t_sleep, cpu, main = self._primed(words)
        # CPU the host spent before `go` beyond its own path's (code of the candidate's ran there)
        early = max(0.0, self.primed_cpu - self.prime_own - self.prime_slack - EARLY_ALLOW_S)
        wall = (t_done - t_go) + max(0.0, (t_sleep - t_done) - self.down_allow) + early
        # `done` is in the host's memory: a kernel that writes it first and works on stops the
        # judge's clock early, by up to the allowance above (tens of us, a whole small kernel:
        # session 37's red team). The CPU it spends cannot be hidden: the main thread's beyond the
        # host's own path, and the whole process's shared over the cores it may run on
        used = max(main - self.main_own, (cpu - self.cpu_own) / self.cores) - CPU_SLACK_S + early
        self.cpu_bound_used = used > wall
        return max(wall, used)

    def scrub(self, nbytes: int) -> None:
        """The stack scrub before every call from now on covers at least `nbytes`."""
        self.scrub_bytes = max(self.scrub_bytes, int(nbytes))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self._report.close()
        if self._stat is not None:
            os.close(self._stat)
            self._stat = None
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _pack(kind: str, v) -> int:
    if kind == "f32":
        return struct.unpack("<I", struct.pack("<f", float(v)))[0]
    if kind == "f64":
        return struct.unpack("<Q", struct.pack("<d", float(v)))[0]
    return int(v) & 0xFFFFFFFFFFFFFFFF


class HostCall:
    """A prepared call: the host and its arguments, pointers translated into the host's arena."""

    local_bytes = 0

    def __init__(self, host: Host, values: list):
        self.host = host
        arena = host.arena
        words = []
        for k, v in zip(host.kinds, values):
            if k == "ptr":
                v = int(v or 0)
                if v and not arena.holds(v):
                    raise ValueError("a kernel argument points outside the kernel host's arena (a judge bug)")
                v = v - arena.base + host.host_base if v else 0
            words.append(_pack(k, v))
        self.words = words

    def __call__(self) -> None:
        self.host.run(self.words)

    def timed(self) -> float:
        return self.host.timed(self.words)

    def scrub(self, nbytes: int) -> None:
        """The judge's scrub ahead of this call: the host's, before the call itself; the host is
        primed for it now (Host.prime), ahead of the judge's refresh and flush."""
        self.host.scrub(nbytes)
        self.host.prime(self.words)


class HostCensus:
    """The thread census of judge/threads.py over the live hosts: after each call of candidate
    code no host may run a thread but its main one (each host's own count, taken at once after
    the call and read by Host._reported, and this listing once the host is asleep again); and
    the hosts' other findings."""

    enabled = True
    per_request = True  # the hosts end with each request (Runtime.release), their threads with them

    def __init__(self):
        self.hosts: list[Host] = []
        self.arena: Arena | None = None  # (set by the runtime) where no write may land outside a block
        self._rng = random.SystemRandom()
        self.why: str | None = None
        self.convicted: set = set()

    def note(self, why: str) -> None:
        if self.why is None:
            self.why = why

    def watch(self, skip: "Host | None" = None) -> None:
        """Every host but `skip` idle since its last command (Host.idle_problem)."""
        for h in self.hosts:
            if h is not skip:
                why = h.idle_problem()
                if why:
                    self.note(why)

    def rebase(self) -> None:
        """A request's start: its hosts are new, and nothing found before counts for it."""
        self.why = None
        self.convicted = set()

    def strays(self) -> list[str]:
        out = []
        for h in self.hosts:
            try:
                tids = os.listdir(f"/proc/{h.pid}/task")
            except OSError:
                continue
            out += [f"{h.pid}/{t}" for t in tids if t != str(h.pid) and not exiting(t, f"/proc/{h.pid}/task")]
        return out

    def check(self, what: str = "the call") -> str | None:
        # the arena's checks (150 to 200 us each with 30 live blocks) after a secret one call in
        # ARENA_EVERY, and always at the end of a loop (`take`): state kept there from one call
        # to the next is found before a loop of 64 calls ends, all but (7/8)**63 of the time
        if self._rng.random() * ARENA_EVERY < 1:
            self._arena_check()
        stray = self.strays()
        if stray:
            self.convicted.update(stray)
            self.note(f"{len(stray)} thread(s) the kernel started were still running after {what} returned: "
                      "work outside the timed call (a kernel must join its threads before it returns)")
        return self.why

    def _arena_check(self) -> None:
        if self.arena is None:
            return
        at = self.arena.stray_data()
        at = at if at is not None else self.arena.slack_written()
        if at is not None:
            self.note(f"the kernel wrote the shared arena outside the buffers its call was given (at byte "
                      f"{at}): memory to keep state in between calls")
            # charged once, to the calls since the last look: what it wrote goes, so that the
            # candidates timed after it in the request are not charged too, nor the whole
            # request (a write in pipe compare's layout voided every arm's time: session 66's review)
            self.arena.punch_free()
            self.arena.clean_slack()

    def take(self) -> str | None:
        self._arena_check()
        why, self.why = self.why, None
        return why


def exit_text(code: int | None) -> str:
    """A process's end as a reason says it: `signal SIGSEGV`, or `exit code 1`."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def exiting(tid: str, task: str) -> bool:
    """True if the thread is exiting or already gone (it runs no more user code)."""
    try:
        with open(f"{task}/{tid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True  # gone between the listing and now
    return kh.stat_exiting(stat)


def not_dumpable() -> None:
    """The worker unreadable through /proc by any process without CAP_SYS_PTRACE (its hosts have none)."""
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
