"""A seccomp filter for the processes that run native candidate code (the CPU backend's kernel
hosts, build/backends/cpu_host.py; the worker itself where no host can run).

Static source rules are a first line; this is the second. Once installed (on
every thread of the process, and inherited by threads a kernel starts), the
process can no longer create or write files, make sockets, start programs,
fork, signal other processes or trace them: such calls fail with EPERM. It
reads files and writes to descriptors it already holds (its pipe to the
runner, its log), which is all the judge needs after setup.

It is a deny list. An allow list would be tighter, but the worker runs torch and Python
after the filter goes on (their threads, allocator, JIT'd oneDNN kernels, dlopen of each
candidate library), whose syscalls vary by version and build; one missed call turns every
trial into a crash, so the list below names what reaches outside the process instead
(files, processes, sockets, io_uring, bpf, perf, userfaultfd, anonymous files, keys,
namespaces, modules). mmap/mprotect with PROT_EXEC stay allowed under it: dlopen and oneDNN's
JIT need them; a kernel host stacks a second filter once its library is loaded
(`no_new_code`), after which no new executable memory can be made, and a third, an allow list
(`loop_only`, LOOP_ALLOW): a loaded host is small and its system calls known, so there the
tighter list holds, and it has no open; with it, Landlock (`no_files`) grants no file at all.

What it cannot stop is a kernel writing to the descriptors its process already
has. A kernel host holds stdout and stderr (the worker's capped log), the socket it reports
its own thread census on and the directory it counts its threads in (build/backends/
kernel_host.py): the judge takes exactly one report a command from that socket, and in a host
no call may close or replace those two (`keep_fds`: close, dup2 and dup3 on them, shutdown and
close_range at all, are refused). Where the worker itself runs the kernel, its pipe to the
runner is one: replies therefore carry a per-request nonce, and the runner checks that exactly
one reply came (`worker.Worker`). In a kernel host the calls that name a process by an argument
(PID_ARGS) may name only the host itself.

x86-64 Linux only; elsewhere `install` returns False and the static rules stand alone.
"""

from __future__ import annotations

import ctypes
import os
import platform

AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1
PR_SET_NO_NEW_PRIVS = 38
SYS_SECCOMP = 317

RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
EPERM, ENOSYS = 1, 38

# x86-64 syscall numbers refused outright.
DENY = {
    85: "creat", 87: "unlink", 263: "unlinkat", 82: "rename", 264: "renameat", 316: "renameat2",
    76: "truncate", 83: "mkdir", 258: "mkdirat", 84: "rmdir", 86: "link", 265: "linkat", 88: "symlink",
    266: "symlinkat", 90: "chmod", 268: "fchmodat", 92: "chown", 41: "socket", 53: "socketpair",
    42: "connect", 49: "bind", 50: "listen", 43: "accept", 288: "accept4", 44: "sendto", 46: "sendmsg",
    59: "execve", 322: "execveat", 57: "fork", 58: "vfork", 62: "kill", 101: "ptrace",
    310: "process_vm_readv", 311: "process_vm_writev", 437: "openat2", 304: "open_by_handle_at",
    165: "mount", 161: "chroot", 169: "reboot",
    # side doors: io_uring carries openat/write/connect/... the filter never sees as syscalls;
    # the others reach other processes, the kernel, or make anonymous files or executable code
    425: "io_uring_setup", 426: "io_uring_enter", 427: "io_uring_register",
    321: "bpf", 323: "userfaultfd", 298: "perf_event_open", 319: "memfd_create", 447: "memfd_secret",
    434: "pidfd_open", 438: "pidfd_getfd", 424: "pidfd_send_signal", 440: "process_madvise",
    448: "process_mrelease", 312: "kcmp", 200: "tkill", 129: "rt_sigqueueinfo", 297: "rt_tgsigqueueinfo", 279: "move_pages", 256: "migrate_pages",
    248: "add_key", 249: "request_key", 250: "keyctl", 175: "init_module", 313: "finit_module",
    176: "delete_module", 246: "kexec_load", 320: "kexec_file_load", 308: "setns", 272: "unshare",
    155: "pivot_root", 166: "umount2", 167: "swapon", 168: "swapoff", 170: "sethostname",
    171: "setdomainname", 163: "acct", 179: "quotactl", 303: "name_to_handle_at", 300: "fanotify_init",
    133: "mknod", 259: "mknodat", 91: "fchmod", 93: "fchown", 94: "lchown", 260: "fchownat",
    132: "utime", 235: "utimes", 261: "futimesat", 280: "utimensat", 188: "setxattr", 189: "lsetxattr",
    190: "fsetxattr", 197: "removexattr", 198: "lremovexattr", 199: "fremovexattr",
    428: "open_tree", 429: "move_mount", 430: "fsopen", 431: "fsconfig", 432: "fsmount", 442: "mount_setattr",
}
OPEN, OPENAT, CLONE, CLONE3 = 2, 257, 56, 435
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
CLONE_THREAD = 0x00010000

# classic BPF
LD_W_ABS, JEQ_K, JSET_K, JGE_K, RET_K = 0x20, 0x15, 0x45, 0x35, 0x06


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


# syscalls that name a process (or thread) by an argument (its index): with the host's own pid
# known (`install(own_pid)`), allowed only for 0 (the caller) or that pid, so no call reaches the
# worker or another process: a signal (tgkill), a priority, an affinity, a scheduling class, limits
PID_ARGS = {234: 0, 141: 1, 203: 0, 144: 0, 142: 0, 314: 0, 251: 1, 302: 0}
# of those, the calls whose `who` is read by another argument, `which` (argument, the one value
# allowed): setpriority(PRIO_PROCESS, ...) and ioprio_set(IOPRIO_WHO_PROCESS, ...) only, since
# `who` = 0 with PRIO_PGRP or PRIO_USER names the caller's whole process group or user, every
# kernel host of a re-timing or a comparison with it (session 38's red team reniced a rival so)
WHICH_ARGS = {141: (0, 0), 251: (0, 1)}
# refused in a kernel host only: signal handlers and timers that would run a kernel's code while
# its host is not in a call (a CPU-time timer fires while the host spins on `go`: session 31's
# third red-team pass precomputed the call's answer there)
HOST_DENY = {13: "rt_sigaction", 38: "setitimer", 37: "alarm", 222: "timer_create", 223: "timer_settime",
             282: "signalfd", 289: "signalfd4",
             # the host's census channel (`keep_fds` below): shut down, or closed in a range
             48: "shutdown", 436: "close_range"}
# in a kernel host, the calls that would close or replace one of its own descriptors (the
# socket it reports its thread census on, the directory it counts its threads in: `keep_fds`),
# by the argument that names the descriptor replaced: close(fd), dup2(old, fd), dup3(old, fd, flags)
CLOSE, DUP2, DUP3 = 3, 33, 292
FD_ARGS = {CLOSE: 0, DUP2: 1, DUP3: 1}


def _program(own_pid: int | None = None, keep_fds: tuple[int, ...] = ()) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) rows; jumps are relative to the next row. `keep_fds`: the
    descriptors no call may close or replace (FD_ARGS)."""
    deny = sorted(set(DENY) | (set(HOST_DENY) if own_pid is not None else set()))
    p: list[tuple[int, int, int, int]] = []
    p.append((LD_W_ABS, 0, 0, 4))  # arch
    p.append((JEQ_K, 1, 0, AUDIT_ARCH_X86_64))
    # another ABI (i386 through `int $0x80`, whose numbers differ): refused outright, since an
    # x86-64 worker never uses one and a deny list keyed on x86-64 numbers would not apply
    p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
    p.append((LD_W_ABS, 0, 0, 0))  # syscall number
    p.append((JGE_K, 0, 1, 0x40000000))  # x32 numbers
    p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
    for nr in deny:  # jump over the next row (allow-continue) to the EPERM at the end of each pair
        p.append((JEQ_K, 0, 1, nr))
        p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
    if own_pid is not None:
        for nr, arg in sorted(PID_ARGS.items()):
            # nr? (with a `which`: load it, anything but the one allowed -> EPERM) load the
            # argument's low word: 0 or own pid -> reload the number and go on; anything else -> EPERM
            which = WHICH_ARGS.get(nr)
            p.append((JEQ_K, 0, 5 + (3 if which else 0), nr))
            if which:
                p.append((LD_W_ABS, 0, 0, 16 + 8 * which[0]))
                p.append((JEQ_K, 1, 0, which[1]))
                p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
            p.append((LD_W_ABS, 0, 0, 16 + 8 * arg))
            p.append((JEQ_K, 2, 0, 0))
            p.append((JEQ_K, 1, 0, own_pid & 0xFFFFFFFF))
            p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
            p.append((LD_W_ABS, 0, 0, 0))
    for fd in keep_fds:
        for nr, arg in sorted(FD_ARGS.items()):
            # nr? load the argument's low word (the kernel reads an unsigned int): fd -> EPERM;
            # anything else -> reload the number and go on (not nr: jump past the reload)
            p.append((JEQ_K, 0, 4, nr))
            p.append((LD_W_ABS, 0, 0, 16 + 8 * arg))
            p.append((JEQ_K, 0, 1, fd & 0xFFFFFFFF))
            p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
            p.append((LD_W_ABS, 0, 0, 0))
    # clone3 -> ENOSYS, so that glibc falls back to clone (checked below)
    p.append((JEQ_K, 0, 1, CLONE3))
    p.append((RET_K, 0, 0, RET_ERRNO | ENOSYS))
    # clone: threads only (CLONE_THREAD in the flags, argument 0)
    p.append((JEQ_K, 0, 3, CLONE))
    p.append((LD_W_ABS, 0, 0, 16))
    p.append((JSET_K, 1, 0, CLONE_THREAD))
    p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
    p.append((LD_W_ABS, 0, 0, 0))  # reload the number (both paths land here)
    # open(path, flags): flags are argument 1; openat(dirfd, path, flags): argument 2
    p.append((JEQ_K, 0, 3, OPEN))
    p.append((LD_W_ABS, 0, 0, 16 + 8 * 1))
    p.append((JSET_K, 5, 6, WRITE_FLAGS))  # -> EPERM / ALLOW below
    p.append((LD_W_ABS, 0, 0, 0))
    p.append((JEQ_K, 0, 4, OPENAT))
    p.append((LD_W_ABS, 0, 0, 16 + 8 * 2))
    p.append((JSET_K, 1, 2, WRITE_FLAGS))
    p.append((RET_K, 0, 0, RET_ALLOW))  # unreachable filler keeps the offsets simple
    p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
    p.append((RET_K, 0, 0, RET_ALLOW))
    return p


MMAP, MPROTECT, PKEY_MPROTECT, SHMAT, PERSONALITY, MREMAP, REMAP_FILE_PAGES = 9, 10, 329, 30, 135, 25, 216
PROT_EXEC, SHM_EXEC = 4, 0o100000
ENOMEM = 12


def _no_exec_program() -> list[tuple[int, int, int, int]]:
    """The second filter of a kernel host, once its library is loaded: no new executable memory
    (mmap, mprotect or pkey_mprotect with PROT_EXEC, shmat with SHM_EXEC; no mremap or
    remap_file_pages, which move or grow a mapping with its protection) and no personality
    change (READ_IMPLIES_EXEC would make readable mappings executable). Code a kernel writes at
    run time ran unread by every rule of the compiled code (session 39's CPU red team called an
    approximate rsqrt it copied into a page it made executable)."""
    p: list[tuple[int, int, int, int]] = [(LD_W_ABS, 0, 0, 0)]
    p.append((JEQ_K, 0, 1, PERSONALITY))
    p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
    # mremap keeps a mapping's protection: the library's own code mapping grown over the pages of
    # its constants made them executable (session 39's second CPU red team). ENOMEM: glibc's
    # realloc then copies, as it does when a mapping cannot grow
    p.append((JEQ_K, 0, 1, MREMAP))
    p.append((RET_K, 0, 0, RET_ERRNO | ENOMEM))
    p.append((JEQ_K, 0, 1, REMAP_FILE_PAGES))
    p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
    for nr, arg, bit in ((MMAP, 2, PROT_EXEC), (MPROTECT, 2, PROT_EXEC), (PKEY_MPROTECT, 2, PROT_EXEC),
                         (SHMAT, 2, SHM_EXEC)):
        p.append((JEQ_K, 0, 3, nr))
        p.append((LD_W_ABS, 0, 0, 16 + 8 * arg))
        p.append((JSET_K, 0, 1, bit))
        p.append((RET_K, 0, 0, RET_ERRNO | EPERM))
        p.append((LD_W_ABS, 0, 0, 0))  # (not taken: reload the number for the next test)
    p.append((RET_K, 0, 0, RET_ALLOW))
    return p


# The kernel host's third filter, once its library is loaded: an allow list. What a loaded host
# still does is small and known (kernel_host.py's loop: futex waits, sched_yield, the census's
# listing and its stop (tgkill), its report's write, the GS base, the stack scrub's signal mask,
# Python's allocator), and so is what a kernel's own code needs (threads and their stacks,
# futexes, memory, printf, sleeps); everything else is refused. Refused in particular:
# every clock (clock_gettime, gettimeofday, time, times, getrusage, sysinfo, timerfd, the waits
# that report what is left of a timeout, absolute deadlines): the time-stamp counter is already off
# (PR_SET_TSC), and a kernel that reads the time by a system call instead could key its work to
# it (session 38's fourth red team was slow in most rounds of a comparison and fast in one);
# prctl, which would turn that counter back on; every open (a thread's /proc files hold its
# CPU time and the scheduler's clock: schedstat, sched, stat; /proc/uptime the time since
# boot): the census lists its folder's entries, and the judge reads the threads' flags;
# madvise's advice that drops or pages out shared
# memory (MADV_REMOVE punches the arena, MADV_PAGEOUT and MADV_COLD evict a rival's pages); and
# the futex operations that move or take another process's waiters on shared memory (a
# requeue of a rival host's sleep on its command word would leave it asleep for good, a hang
# charged to the rival).
LOOP_ALLOW = {
    0: "read", 1: "write", 3: "close", 8: "lseek", 9: "mmap", 10: "mprotect", 11: "munmap",
    12: "brk", 14: "rt_sigprocmask", 15: "rt_sigreturn", 17: "pread64", 19: "readv", 20: "writev",
    24: "sched_yield", 25: "mremap", 35: "nanosleep", 39: "getpid", 56: "clone", 60: "exit", 63: "uname",
    72: "fcntl", 97: "getrlimit", 102: "getuid", 104: "getgid", 107: "geteuid", 108: "getegid",
    110: "getppid", 131: "sigaltstack", 141: "setpriority", 143: "sched_getparam",
    145: "sched_getscheduler", 158: "arch_prctl", 186: "gettid", 204: "sched_getaffinity",
    218: "set_tid_address", 219: "restart_syscall", 231: "exit_group", 234: "tgkill",
    273: "set_robust_list", 302: "prlimit64", 309: "getcpu", 318: "getrandom",
    334: "rseq", 435: "clone3",
}
# (clone, clone3, tgkill, setpriority, prlimit64, close, mmap, mprotect and mremap pass here and
# stay under the first two filters' rules: threads only, this process only, the census's
# descriptors kept, no executable memory.) Not on the list: sched_setaffinity (a host runs on the
# cores the judge pinned it to, runtime.threads of them, as the baseline does: a kernel that
# widened its own set ran on more), membarrier (its global command interrupts every CPU), the
# stat calls (newfstatat, statx, fstat: a file's times are a clock, the log the host writes to
# is stamped at every write, the census's folder holds the realtime clock when the host opened it,
# and Landlock does not mediate them)
IOCTL, TCGETS, FUTEX, MADVISE, GETDENTS64, CLOCK_NANOSLEEP = 16, 0x5401, 202, 28, 217, 230
FUTEX_PRIVATE = 128
FUTEX_CMD_MASK = 0x7F  # the operation itself, without the private and clock flags
# on a shared word (one another process may sleep on): WAIT and WAIT_BITSET only, what a join needs
# (glibc waits on a thread's id, which the kernel itself clears and wakes at the thread's exit). A
# wake would rouse a rival host asleep on its command word, its CPU spent between its commands;
# a kernel's own threads wake each other with private operations (std::thread, glibc's locks).
# (The judge wakes every waiter on a host's words, so a kernel's wait there steals no wake.)
FUTEX_SHARED_OPS = (0, 9)
# the operations whose timeout is an absolute time (WAIT_BITSET, LOCK_PI, WAIT_REQUEUE_PI,
# LOCK_PI2): a deadline in the past returns at once and one in the future waits, a comparator
# with the clock, so only without a timeout
FUTEX_DEADLINE_OPS = (9, 6, 11, 13)
# MADV_NORMAL, RANDOM, SEQUENTIAL, WILLNEED, DONTNEED (a shared page read again from the arena,
# unchanged), FREE, HUGEPAGE, NOHUGEPAGE, DONTDUMP, DODUMP: what allocators and thread stacks use
MADV_ALLOWED = (0, 1, 2, 3, 4, 8, 14, 15, 16, 17)
ALU_AND_K = 0x54


def _assemble(rows: list) -> list[tuple[int, int, int, int]]:
    """Rows of (code, jt, jf, k) whose jumps may name a label (a string), and labels as one-element
    tuples ("name",), into rows whose jumps are relative to the next row."""
    at, n = {}, 0
    for r in rows:
        if len(r) == 1:
            at[r[0]] = n
        else:
            n += 1
    out: list[tuple[int, int, int, int]] = []
    for r in rows:
        if len(r) == 1:
            continue
        code, jt, jf, k = r
        here = len(out) + 1
        jt = at[jt] - here if isinstance(jt, str) else jt
        jf = at[jf] - here if isinstance(jf, str) else jf
        assert 0 <= jt < 256 and 0 <= jf < 256, r
        out.append((code, jt, jf, k))
    return out


def _loop_program(census_fd: int) -> list[tuple[int, int, int, int]]:
    """The allow list (LOOP_ALLOW) as (code, jt, jf, k) rows; and with their arguments checked:
    getdents64 of the census's folder only (`census_fd`: its entries are the host's threads; no
    stat of it, whose times are the realtime clock when the host opened it);
    ioctl only to ask whether a descriptor is a terminal (TCGETS, stdio's question); futex
    operations on shared words only FUTEX_SHARED_OPS, and those of FUTEX_DEADLINE_OPS only without
    a timeout (by either clock: glibc's join waits with FUTEX_CLOCK_REALTIME and none);
    clock_nanosleep only for a relative time; madvise only the advice of MADV_ALLOWED; the rest
    EPERM."""
    def arg(i: int, high: bool = False) -> tuple:
        return (LD_W_ABS, 0, 0, 16 + 8 * i + (4 if high else 0))

    rows: list = [(LD_W_ABS, 0, 0, 0)]
    rows += [(JEQ_K, "allow", 0, nr) for nr in sorted(LOOP_ALLOW)]
    rows += [(JEQ_K, "ioctl", 0, IOCTL), (JEQ_K, "futex", 0, FUTEX), (JEQ_K, "getdents64", 0, GETDENTS64),
             (JEQ_K, "sleep", 0, CLOCK_NANOSLEEP), (JEQ_K, "madvise", "deny", MADVISE)]
    rows += [("ioctl",), arg(1), (JEQ_K, "allow", "deny", TCGETS)]
    rows += [("getdents64",), arg(0), (JEQ_K, "allow", "deny", census_fd & 0xFFFFFFFF)]
    rows += [("sleep",), arg(1), (JEQ_K, "allow", "deny", 0)]  # flags: not TIMER_ABSTIME
    rows += [("futex",), arg(1), (ALU_AND_K, 0, 0, FUTEX_CMD_MASK)]
    rows += [(JEQ_K, "no_deadline", 0, op) for op in FUTEX_DEADLINE_OPS] + [(JEQ_K, "shared", "shared", 0)]
    rows += [("no_deadline",), arg(3), (JEQ_K, 0, "deny", 0), arg(3, high=True), (JEQ_K, "shared", "deny", 0)]
    rows += [("shared",), arg(1), (JSET_K, "allow", 0, FUTEX_PRIVATE), (ALU_AND_K, 0, 0, FUTEX_CMD_MASK)]
    rows += [(JEQ_K, "allow", 0, op) for op in FUTEX_SHARED_OPS] + [(JEQ_K, "deny", "deny", 0)]
    rows += [("madvise",), arg(2)]
    rows += [(JEQ_K, "allow", 0, a) for a in MADV_ALLOWED]
    rows += [("deny",), (RET_K, 0, 0, RET_ERRNO | EPERM), ("allow",), (RET_K, 0, 0, RET_ALLOW)]
    return _assemble(rows)


def _load(rows) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    arr = (_Filter * len(rows))(*[_Filter(*r) for r in rows])
    prog = _Prog(len(rows), arr)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(SYS_SECCOMP), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    return rc == 0


def no_new_code() -> bool:
    """Stack the no-executable-memory filter (_no_exec_program) on this process; True if it is
    in force. For a kernel host after LOAD: the loader needed PROT_EXEC, nothing after it does."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    return _load(_no_exec_program())


def loop_only(census_fd: int) -> bool:
    """Stack the allow list (_loop_program) on this process; True if it is in force. For a kernel
    host after LOAD, beside `no_new_code`: from then on it runs only its loop and the kernel's calls
    (`census_fd`: the folder its census counts threads in, the one descriptor getdents64 may read)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    return _load(_loop_program(census_fd))


# Landlock (Linux 5.13 and later): the files a kernel host may still open once its library is
# loaded. Its census opens /proc/<host>/task/<tid>/stat (kernel_host._Census); nothing else it does
# opens a file, and a kernel has no need to: without this, it read whatever the user can (the
# run's ledger, the spec, the cache, /proc's clocks and other processes' state). The primitives
# below serve the command agents' confinement too (search/agents/confine.py loads this file).
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # x86-64, arm64
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_READ_FILE, LANDLOCK_READ_DIR = 1 << 2, 1 << 3
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, LANDLOCK_SCOPE_SIGNAL = 1 << 0, 1 << 1


class LandlockRuleset(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class LandlockBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_fs_rights(abi: int) -> int:
    """Every filesystem right the ABI knows (all handled, so none is allowed by default): the
    first 13, then REFER (2), TRUNCATE (3), IOCTL_DEV (5)."""
    return (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, too old a kernel,
    Landlock not among the kernel's security modules)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        r = libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return int(r) if r > 0 else 0


def no_files() -> int:
    """Restrict this process for good to no file access at all (every open, whatever the path,
    EACCES; descriptors already open stay usable), and where the ABI has them (6), signals and
    abstract unix sockets inside the process. The ABI in force, or 0 where the kernel has no
    Landlock or the restriction failed (the seccomp filters stand alone: a loaded host's allow
    list has no open either)."""
    v = landlock_abi()
    if v < 1:
        return 0
    attr = LandlockRuleset(landlock_fs_rights(v), 0,
                           LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL if v >= 6 else 0)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                      ctypes.c_size_t(24 if v >= 6 else 8), ctypes.c_uint32(0))
    if fd < 0:
        return 0
    try:
        if libc.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return 0
        return v
    finally:
        os.close(fd)


def install(own_pid: int | None = None, keep_fds: tuple[int, ...] = ()) -> bool:
    """Install the filter on every thread of this process; True if it is in force. With
    `own_pid` (the kernel host's), the syscalls of PID_ARGS may name only the caller; no call
    may close or replace a descriptor of `keep_fds` (FD_ARGS)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return _load(_program(own_pid, tuple(keep_fds)))
