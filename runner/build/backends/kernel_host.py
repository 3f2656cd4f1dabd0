"""The kernel host: the process a CPU candidate's library runs in (the judge's side: cpu_host.py).

Started by the judge's worker as `python -I -S kernel_host.py ARENA_FD ARENA_BYTES CTL_FD PPID
SANDBOX_PY REPORT_FD`, with the shared arena's descriptor, its control block's and its end of the
census socket its only ones besides stdout and stderr. It maps the arena (the inputs, outputs and
scratch buffers of the calls, which every host of a request maps) and its control block (a file
of its own, which only the judge maps besides), takes away its own capabilities and goes under the
seccomp filter (judge/sandbox.py, with the checks that need its own pid), and only then loads the
candidate's library: the library's load-time code already runs confined. Once it is loaded, two more
filters (no new executable memory; an allow list of the loop's calls and a kernel's own needs, no
clock and no open among them) and Landlock (no file at all) close the rest. From
then on it does what the control block says and nothing else, sleeping on a futex between commands:

- LOAD: the library and its entry (once);
- PRIME, every call's, timed or not: the stack scrubbed (all of the stack a call can reach below
  the host's loop, STACK_ROOM, to which the stack's limit is lowered at the start: a memo left
  below the frame of one call would wait there for the next), the arguments decoded, the
  floating-point environment and the control block's unused words reset, `ack`, then asleep on
  `go` (the judge reads this process's CPU time then, exact while it sleeps) until `go` says
  WAKE, `started`, a spin on `go` (the judge starts its clock as it writes it), the entry,
  `done`, at once this process's census of its own threads (`_Census`: with any besides the
  main one, it stops itself for the judge to list them), the floating-point check; `go` with
  ABORT calls it off. The judge waits for `ack`, and for this process asleep on `go` where this
  loop sleeps, before it refreshes the inputs and flushes, so the host's wake-up is never timed;
  the CPU this process spent from its last command to that sleep, beyond its own path's, is
  charged to the call. `done` is the kernel's to write too (it is in this process's memory): the
  judge takes the call's time as at least the CPU this process spent from its sleep on `go` to its
  sleep on the next command, beyond the host's own (cpu_host.Host.timed).

After every command, a record of the census (`REPORT`: the command's sequence number, the
threads alive but the main one) goes to the census socket, whose other end only
the worker holds: the kernel can add records there (the judge then finds more than one) but
never take one back, and the filter keeps it from closing or replacing the descriptor.

Nothing the judge decides with lives here: the timer, the references, the value sets and the
sampled positions stay in the worker. Whatever the candidate does to this process (its memory,
the control block, `done`) is seen by the judge only as what it checks anyway: the outputs, the
time between `go` and `done` on its own clock, this process's threads after every call (its own
census's report, and its own listing), and its CPU time between commands (none may be spent while
the host should be asleep).

Only the standard library: this file runs with no site packages and no project imports.
"""

from __future__ import annotations

import ctypes
import importlib.util
import mmap
import os
import struct
import sys

# the control block (u32 words; futexes on `seq` and `go`)
SEQ, DONE, CMD, GO, ACK, STATUS, NARGS, STARTED = 0, 4, 8, 12, 16, 20, 24, 28
SCRUB_BYTES_AT = 32  # u64
ARGS_AT = 64  # u64 x MAX_ARGS: each argument's raw bits
MAX_ARGS = 64
KINDS_AT = ARGS_AT + 8 * MAX_ARGS  # u8 x MAX_ARGS: 1 i32, 2 i64, 3 f32, 4 f64, 5 ptr
TEXT_AT = 1024  # the library's path and entry (LOAD), or an error back
TEXT_BYTES = 3072
CTL_BYTES = 4096
PRIME, LOAD, STAND_IN = 2, 4, 8
ABORT = 0x80000000  # `go` as seq ^ ABORT: a primed call called off (the judge primed other arguments)
WAKE = 0x40000000  # `go` as seq ^ WAKE: up from the sleep after `ack`, to spin on `go`
KIND_CODES = {"i32": 1, "i64": 2, "f32": 3, "f64": 4, "ptr": 5}
# the census's record after every command: its sequence number, the threads found alive in this
# process but its main one, exiting ones included (one datagram of exactly this size); with any,
# the process stops itself for the judge's listing once the record is written (_Census.hold)
REPORT = struct.Struct("<II")
PF_EXITING = 0x4  # set by the kernel as a thread starts to exit, before a join can return


def stat_exiting(stat: bytes) -> bool:
    """A thread's /proc stat line says it is exiting or gone (it runs no more user code): the
    judge's listings (cpu_host.exiting) read it so."""
    # fields after the command (which may hold spaces and parentheses): state is field 3, flags 9
    rest = stat[stat.rindex(b")") + 2:].split()
    return rest[0] in (b"Z", b"X") or bool(int(rest[6]) & PF_EXITING)

SYS_FUTEX, FUTEX_WAIT, FUTEX_WAKE = 202, 0, 1
SYS_GETDENTS64, SYS_TGKILL, SIGSTOP = 217, 234, 19
DENTS_BYTES = 1 << 15
MAP_FIXED = 0x10
WAKE_ALL = 0x7FFFFFFF  # the judge wakes every waiter on a host's words: a kernel asleep there steals none
SYS_CAPSET = 126
PR_SET_PDEATHSIG = 1
PR_SET_TSC, PR_TSC_SIGSEGV = 26, 2
SCRUB_MARGIN = 256
# stack a call may use below the host's loop (the kernel's frames, ctypes' and libffi's): the
# judge's scrub (1 MiB, cpu.Runtime.SCRUB_BYTES) and room for the call's way down; all of it is
# scrubbed before every call (_Stack)
STACK_ROOM = (1 << 20) + (256 << 10)
RLIMIT_STACK = 3
SYS_ARCH_PRCTL, ARCH_SET_GS = 158, 0x1001
FE_DFL_ENV = ctypes.c_void_p(-1)  # glibc's default environment: MXCSR 0x1f80, x87 control word 0x37f
# STATUS after a call: the floating-point control state was not the default's when the kernel
# returned (MXCSR's flush-to-zero, denormals-are-zero, rounding or exception-mask bits, or the
# x87 control word's precision, rounding or masks), by whatever route it was set
FENV_CHANGED = 16
_X87_CONTROL, _X87_DEFAULT = 0x0F3F, 0x037F & 0x0F3F
_MXCSR_CONTROL, _MXCSR_DEFAULT = 0xFFC0, 0x1F80


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _drop_capabilities(libc) -> None:
    """Every capability gone (root included): no CAP_SYS_PTRACE into the worker, no
    CAP_DAC_OVERRIDE around file modes."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice (64 bits), all zero
    if libc.syscall(ctypes.c_long(SYS_CAPSET), header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


class _Stack:
    """This thread's stack: bounded below the host's loop, and scrubbed before every call
    (getcontext for the stack pointer, memset below it).

    A call may use STACK_ROOM bytes of stack below the loop's frame and no more: `bound` lowers
    the stack's limit (soft and hard, so the kernel cannot raise it again) to what lies above
    that frame and STACK_ROOM below it, and `scrub` overwrites all of it, from right below the
    frame down to the limit, whatever the judge asks for. Left at the system's limit (8 MiB), a
    memo 2.5 MiB down, under the scrub's 1 MiB, kept a compute-bound op's answers from call to
    call (a red team, session 35); now a value left anywhere a call can reach is gone by the
    next one, and a kernel that goes deeper faults (the judge records the crash)."""

    def __init__(self, libc):
        self.memset = libc.memset
        self.memset.restype, self.memset.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        self.getcontext = libc.getcontext
        self.getcontext.restype, self.getcontext.argtypes = ctypes.c_int, [ctypes.c_void_p]
        self.setrlimit = libc.setrlimit
        self.ctx = ctypes.create_string_buffer(4096)
        libc.pthread_self.restype = ctypes.c_ulong
        attr = ctypes.create_string_buffer(256)
        addr, size = ctypes.c_void_p(), ctypes.c_size_t()
        self.low, self.bounded = 1 << 62, False
        if libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) == 0:
            if libc.pthread_attr_getstack(attr, ctypes.byref(addr), ctypes.byref(size)) == 0:
                self.low = int(addr.value or 0)
            libc.pthread_attr_destroy(attr)

    def _sp(self) -> int | None:
        if self.getcontext(self.ctx) != 0:
            return None
        return int.from_bytes(bytes(self.ctx[160:168]), "little")  # uc_mcontext.gregs[REG_RSP]

    def bound(self, room: int) -> bool:
        """The stack's limit lowered to what lies above this frame and `room` below it (before
        the filter, which may refuse setrlimit). Pages the process already mapped deeper (an
        earlier excursion) stay reachable: the scrub goes down to them too."""
        sp = self._sp()
        mapped = None  # the stack's mapping, [start, end): its end is the top the limit counts from
        with open("/proc/self/maps") as maps:
            for line in maps:
                if line.rstrip().endswith("[stack]"):
                    mapped = [int(v, 16) for v in line.split()[0].split("-")]
        if sp is None or mapped is None or not mapped[0] <= sp < mapped[1]:
            return False
        limit = (mapped[1] - sp + room + 4095) & ~4095
        if self.setrlimit(RLIMIT_STACK, (ctypes.c_uint64 * 2)(limit, limit)) != 0:
            return False
        self.low = min(mapped[1] - limit, mapped[0])
        self.bounded = True
        return True

    def scrub(self, nbytes: int) -> None:
        sp = self._sp()
        if sp is None or nbytes <= 0:  # (0: no scrub, a test's control)
            return
        top = sp - SCRUB_MARGIN
        # bounded: everything a call can reach (the judge's nbytes is less); else nbytes, above
        # glibc's guard
        bottom = self.low if self.bounded else max(top - nbytes, self.low + 65536)
        if top > bottom:
            self.memset(ctypes.c_void_p(bottom), 0, ctypes.c_size_t(top - bottom))


class _Census:
    """This process's threads, counted by its main thread at once after a call returns: a thread
    of the kernel's still alive then outlived its call, however soon it ends after.

    The judge's own listing (cpu_host.HostCensus) comes after the host is asleep again, and a thread
    that ends in between (tens of microseconds) was never seen: the `deferred_thread` red-team
    kernel, which hands its rows to a thread and returns, passed so on an idle machine. Counted
    here, with nothing of the host's before it but `done`: the entries of the directory
    /proc/self/task, opened once (before the filters, which keep it open and in place), one a
    thread (a thread is listed from its start until it is gone, exiting or not), read with the
    bare getdents64 (a few us; not its link count, by fstat: the folder's times are the realtime
    clock when it was opened, a date a kernel could key on). Where there is more than the main
    thread, this process stops itself (SIGSTOP: every thread of it that is not already exiting
    stops at once, before it runs another instruction of the kernel's) and the judge, which may
    read every file, lists the threads and their flags while it is stopped, then lets it go on
    (cpu_host.Host._look_while_held): a thread already
    exiting (PF_EXITING, set before its join returns; it runs no more code of the kernel's) is let
    through, any other is work outside the call. Nothing here opens a file: the flags of a thread
    sit beside its times (its stat, schedstat and sched files: clocks), so a host that could read
    them would leave a kernel a clock to key its work on (the loaded host's allow list refuses
    every open)."""

    def __init__(self, libc):
        self.fd = os.open("/proc/self/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.pid = os.getpid()
        # the entries by the bare system call on the folder's descriptor, read from its start (no
        # stat of it: its times are the realtime clock when it was opened, and the loaded host's
        # allow list refuses every stat call; glibc's readdir would stat it)
        self._syscall = libc.syscall
        self._dents = ctypes.create_string_buffer(DENTS_BYTES)

    def others(self) -> int:
        """The threads alive now but the main one, exiting ones included (a folder that cannot be
        read: one, so that the judge looks)."""
        n, raw_at = 0, self._dents
        try:
            os.lseek(self.fd, 0, os.SEEK_SET)
        except OSError:
            return 1
        while (got := self._syscall(ctypes.c_long(SYS_GETDENTS64), ctypes.c_long(self.fd), raw_at,
                                    ctypes.c_long(DENTS_BYTES))) > 0:
            raw, at = ctypes.string_at(raw_at, got), 0
            while at < got:
                n += 1
                at += struct.unpack_from("<H", raw, at + 16)[0]
        if got < 0:
            return 1
        return max(n - 3, 0)  # ".", ".." and the main thread

    def hold(self) -> None:
        """Stop this whole process until the judge, having listed its threads, continues it."""
        self._syscall(ctypes.c_long(SYS_TGKILL), ctypes.c_long(self.pid), ctypes.c_long(self.pid),
                      ctypes.c_long(SIGSTOP))


def _blank_vvar(libc) -> None:
    """The vDSO's data pages ([vvar], [vvar_vclock] in /proc/self/maps), the time its clocks read
    with no system call, replaced by zero pages: its coarse clocks and `time` read 0 from then on,
    and the others find no clock mode there and make the system call, which the allow list
    refuses. (Unmapped, they would fault the host's own interpreter, which reads them; the vDSO's
    code stays, as the dynamic loader reads its symbol tables at every lookup.)"""
    with open("/proc/self/maps", "rb") as f:
        maps = f.read().splitlines()
    for line in maps:
        if line.rstrip().endswith((b"[vvar]", b"[vvar_vclock]")):
            lo, hi = (int(v, 16) for v in line.split()[0].split(b"-"))
            libc.mmap(lo, hi - lo, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED, -1, 0)


def main(argv: list[str]) -> int:
    fd, size, ctl_fd, parent, sandbox_py = int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4]), argv[5]
    report_fd = int(argv[6])
    libc = _libc()
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the worker gone: this process too
    if os.getppid() != parent:
        return 3
    # mapped by libc (Python's mmap keeps a duplicate of the descriptor), then the descriptor
    # closed: the kernel can write the arena's memory, never resize or punch the file under
    # the worker's mapping
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    base = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    # the control block, a file of this host's own (no other host maps it: none can read its
    # words or wake this process on them), likewise
    ctl = libc.mmap(None, CTL_BYTES, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, ctl_fd, 0)
    os.close(ctl_fd)
    if base in (None, ctypes.c_void_p(-1).value) or ctl in (None, ctypes.c_void_p(-1).value):
        return 4
    u32 = (ctypes.c_uint32 * (CTL_BYTES // 4)).from_address(ctl)
    u64 = (ctypes.c_uint64 * (CTL_BYTES // 8)).from_address(ctl)
    seq_p = ctypes.c_void_p(ctl + SEQ)
    go_p = ctypes.c_void_p(ctl + GO)
    sched_yield = libc.sched_yield

    spec = importlib.util.spec_from_file_location("pipe_sandbox", sandbox_py)
    sandbox = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sandbox)
    stack = _Stack(libc)
    stack.bound(STACK_ROOM)
    fesetenv = libc.fesetenv
    fesetenv.restype, fesetenv.argtypes = ctypes.c_int, [ctypes.c_void_p]
    fegetenv = libc.fegetenv
    fegetenv.restype, fegetenv.argtypes = ctypes.c_int, [ctypes.c_void_p]
    env = ctypes.create_string_buffer(64)  # glibc's fenv_t on x86-64: 32 bytes, the x87 control word at 0, MXCSR at 28

    def fenv_changed() -> bool:
        """Whether the floating-point control state is not the default's now."""
        fegetenv(env)
        cw, mx = struct.unpack_from("<H", env.raw, 0)[0], struct.unpack_from("<I", env.raw, 28)[0]
        return (cw & _X87_CONTROL) != _X87_DEFAULT or (mx & _MXCSR_CONTROL) != _MXCSR_DEFAULT
    struct_f, struct_d = struct.Struct("<f"), struct.Struct("<d")
    census = _Census(libc)
    others, hold = census.others, census.hold
    pack, write = REPORT.pack, os.write

    def report(s: int, n: int) -> None:
        """The census of command `s` to the judge (a full or broken socket: no record, which the
        judge takes for what it is); with threads besides the main one, stopped for the judge's
        listing."""
        try:
            write(report_fd, pack(s, n))
        except OSError:
            pass
        if n:
            hold()
    if os.geteuid() == 0:
        _drop_capabilities(libc)
    # the census's socket and directory stay what they are: no call closes or replaces them
    confined = sandbox.install(own_pid=os.getpid(), keep_fds=(report_fd, census.fd))
    u64[ARGS_AT // 8] = base  # the arena's address here, for the judge's pointer translation
    u64[ARGS_AT // 8 + 1] = ctl  # and the control block's
    u32[STATUS // 4] = 1 if confined else 2
    u32[DONE // 4] = s = u32[SEQ // 4]
    report(s, others())

    fn, kinds, callee = None, [], None  # what a call calls: the kernel's entry once loaded, before it a stand-in
    types = {1: ctypes.c_int32, 2: ctypes.c_int64, 3: ctypes.c_float, 4: ctypes.c_double, 5: ctypes.c_void_p}
    last = u32[SEQ // 4]
    while True:
        while u32[SEQ // 4] == last:  # asleep until the judge posts a command
            libc.syscall(ctypes.c_long(SYS_FUTEX), seq_p, FUTEX_WAIT, ctypes.c_uint32(last), None, None, 0)
        last = s = u32[SEQ // 4]
        cmd = u32[CMD // 4]
        if cmd == PRIME:
            stack.scrub(int(u64[SCRUB_BYTES_AT // 8]))  # before every call, outside any timing
            args = []
            for i, k in enumerate(kinds):  # as LOAD read them (the block is the kernel's to write)
                raw = u64[ARGS_AT // 8 + i]
                if k == 3:
                    args.append(struct_f.unpack(struct.pack("<I", raw & 0xFFFFFFFF))[0])
                elif k == 4:
                    args.append(struct_d.unpack(struct.pack("<Q", raw))[0])
                else:  # integers and pointers, two's complement
                    args.append(raw - (1 << 64) if raw >> 63 else raw)
            # what a call could leave for the next one outside its memory: the control block's
            # words the judge does not write again for every call (the host read what it needs
            # at LOAD), and the floating-point state (MXCSR's flush-to-zero, denormals-are-zero
            # and rounding bits, the x87 control word): both set back before every call
            # (session 35's second red team kept a mark in each)
            ctypes.memset(ctl + STATUS, 0, 4)
            ctypes.memset(ctl + 40, 0, ARGS_AT - 40)
            ctypes.memset(ctl + ARGS_AT + 8 * len(kinds), 0, 8 * (MAX_ARGS - len(kinds)))
            ctypes.memset(ctl + KINDS_AT, 0, CTL_BYTES - KINDS_AT)
            fesetenv(FE_DFL_ENV)
            # and the GS segment's base, a 64-bit register no memory check sees, which user code
            # writes with `wrgsbase` (FSGSBASE, no system call) and nothing on x86-64 Linux uses:
            # zero, as the process started (session 53's CPU red team kept a mark and a call
            # count in it)
            libc.syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_SET_GS), ctypes.c_ulong(0))
            u32[ACK // 4] = s
            # asleep until the judge wakes it (it reads this process's CPU time while it sleeps
            # here, which is exact, and charges the call what it spends from here to asleep
            # again), then `started` and a spin on `go` (the judge's clock starts as it writes it:
            # the wake-up is not the call's); the spin yields, as the judge may share this core
            while (g := u32[GO // 4]) not in (s ^ WAKE, s ^ ABORT):
                libc.syscall(ctypes.c_long(SYS_FUTEX), go_p, FUTEX_WAIT, ctypes.c_uint32(g), None, None, 0)
            u32[STARTED // 4] = s
            while (go := u32[GO // 4]) not in (s, s ^ ABORT):
                sched_yield()
            if go == s and callee is not None:
                # (before LOAD, the stand-in: the judge's calibration takes the same path after
                # it as a kernel's call, so that the path's own time is calibrated out)
                callee(*args)
                u32[DONE // 4] = s  # the judge's clock stops
                # at once: a thread of the kernel's alive now, not exiting, outlived its call (with
                # any, the process stops here and the judge lists them)
                report(s, others())
                # after the kernel returned: its control state as it left it (the judge reads
                # STATUS once the host is asleep again)
                if fenv_changed() and fn is not None:
                    u32[STATUS // 4] = FENV_CHANGED
                    fesetenv(FE_DFL_ENV)
                continue
        elif cmd == STAND_IN and fn is None:
            # before LOAD, for the judge's calibration: the arguments' kinds (as LOAD reads them)
            # and a C function that ignores them (getppid), so that a calibrating call converts
            # and passes the same arguments a call of the entry will, and only the entry's own
            # work is missing from it
            n = u32[NARGS // 4]
            kinds = list((ctypes.c_uint8 * MAX_ARGS).from_address(ctl + KINDS_AT)[:n])
            stand_in = libc.getppid
            stand_in.restype = ctypes.c_int
            stand_in.argtypes = [types[k] for k in kinds]
            callee = stand_in
        elif cmd == LOAD:
            text = bytes((ctypes.c_char * TEXT_BYTES).from_address(ctl + TEXT_AT)).split(b"\0")
            path, entry = text[0].decode(), text[1].decode()
            n = u32[NARGS // 4]
            kinds = list((ctypes.c_uint8 * MAX_ARGS).from_address(ctl + KINDS_AT)[:n])
            # no time-stamp counter from here on (`rdtsc` faults): a kernel that keys its work on a
            # clock was slow in most rounds of a comparison and fast in one (session 38's fourth red
            # team); this loop reads no clock (futex waits without timeouts), and the judge times
            # from its own process. A kernel that reads one now faults: `fault`, never a figure
            # Nor the vDSO's clocks: its coarse ones read the kernel's time from the vvar pages
            # with no counter and no system call (session 64's review read CLOCK_MONOTONIC_COARSE
            # after the allow list): those pages are zeros now (first: this interpreter reads its
            # files through a path that reads the clock, a fault once the counter is off)
            _blank_vvar(libc)
            libc.prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0)
            try:
                fn = getattr(ctypes.CDLL(path), entry)  # (the library's load-time code runs confined)
                fn.restype = None
                fn.argtypes = [types[k] for k in kinds]
                callee = fn
                # loaded: no executable memory is made from here on (code written at run time is
                # code no reader of the compiled code saw); no file opened at all (the allow list
                # has no open, and Landlock, where the kernel has it, grants none: /proc's files
                # hold clocks); no system call but the loop's and what a kernel's own code needs
                # (sandbox.LOOP_ALLOW: no clock, no prctl)
                sandbox.no_new_code()
                sandbox.no_files()
                sandbox.loop_only(census.fd)
                u32[STATUS // 4] = 0
            except (OSError, AttributeError) as e:
                msg = f"{type(e).__name__}: {e}".encode()[:TEXT_BYTES - 1]
                ctypes.memmove(ctl + TEXT_AT, msg + b"\0", len(msg) + 1)
                u32[STATUS // 4] = 4
        u32[DONE // 4] = s  # the judge spins on it (no wake-up), then waits for this process asleep
        report(s, others())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
