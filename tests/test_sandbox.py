"""The seccomp filter of CPU workers: what it refuses, and what it leaves working."""

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64",
                                reason="the filter is for x86-64 Linux")

PROBE = textwrap.dedent("""
    import os, socket, threading, sys
    from runner.judge import sandbox
    print("installed", sandbox.install())
    open("/proc/self/status").read()
    print("read ok")
    target = sys.argv[1]
    for what, fn in [("create", lambda: open(target, "w")), ("append", lambda: open("/proc/self/status", "a")),
                     ("fork", os.fork), ("socket", socket.socket), ("exec", lambda: os.execv("/bin/true", ["true"])),
                     ("kill", lambda: os.kill(os.getppid(), 0)), ("unlink", lambda: os.unlink(target)),
                     ("mkdir", lambda: os.mkdir(target + ".d"))]:
        try:
            fn()
            print(what, "ALLOWED")
        except OSError as e:
            print(what, "refused", e.errno)
    out = []
    t = threading.Thread(target=lambda: out.append(1))
    t.start(); t.join()
    print("thread", out)
    os.write(1, b"write to an open descriptor ok\\n")
""")


def test_filter_refuses_files_processes_and_sockets(tmp_path):
    target = tmp_path / "made-by-sandboxed-code"
    r = subprocess.run([sys.executable, "-c", PROBE, str(target)], capture_output=True, text=True, timeout=60)
    out = r.stdout
    assert r.returncode == 0, r.stderr
    assert "installed True" in out and "read ok" in out
    for what in ("create", "append", "fork", "socket", "exec", "kill", "unlink", "mkdir"):
        assert f"{what} refused 1" in out, out
    assert "thread [1]" in out  # threads still start (clone with CLONE_THREAD)
    assert "write to an open descriptor ok" in out
    assert not target.exists()


@pytest.mark.parametrize("own_pid, keep_fds", [(None, ()), (4321, ()), (4321, (1000, 1003))])
def test_filter_program_is_well_formed(own_pid, keep_fds):
    from runner.judge import sandbox

    prog = sandbox._program(own_pid, keep_fds)
    if own_pid is not None:  # each call that names a process: 0 or the host's own pid, else EPERM
        assert sum(1 for r in prog if r == (sandbox.JEQ_K, 1, 0, own_pid)) == len(sandbox.PID_ARGS)
    for fd in keep_fds:  # close, dup2 and dup3 onto it: EPERM
        assert sum(1 for r in prog if r == (sandbox.JEQ_K, 0, 1, fd)) == len(sandbox.FD_ARGS)
    for i, (code, jt, jf, k) in enumerate(prog):
        if code in (sandbox.JEQ_K, sandbox.JSET_K, sandbox.JGE_K):
            assert i + 1 + max(jt, jf) < len(prog), f"row {i} jumps past the end"
    assert prog[-1] == (sandbox.RET_K, 0, 0, sandbox.RET_ALLOW)


WHICH_PROBE = textwrap.dedent("""
    import ctypes, os
    from runner.judge import sandbox
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    print("installed", sandbox.install(own_pid=os.getpid()))
    def call(nr, *a):
        rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(v) for v in a])
        return 0 if rc != -1 else ctypes.get_errno()
    # setpriority(which, who = 0, nice 1): the caller alone, its process group, its user
    print("prio", [call(141, which, 0, 1) for which in (0, 1, 2)])
    # ioprio_set(which, who = 0, best effort level 7): the caller, its group, its user
    print("ioprio", [call(251, which, 0, (2 << 13) | 7) for which in (1, 2, 3)])
""")


def test_a_host_renices_only_itself_never_its_group_or_user():
    """`who` = 0 names the caller's process group under PRIO_PGRP (every kernel host of a
    re-timing or a comparison shares it) and its user under PRIO_USER: the filter allows only
    PRIO_PROCESS (and IOPRIO_WHO_PROCESS)."""
    import ast
    import errno

    r = subprocess.run([sys.executable, "-c", WHICH_PROBE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert lines["installed"] == "True"
    assert ast.literal_eval(lines["prio"]) == [0, errno.EPERM, errno.EPERM], r.stdout
    assert ast.literal_eval(lines["ioprio"]) == [0, errno.EPERM, errno.EPERM], r.stdout


def _decide(prog: list, nr: int, args: tuple = ()) -> str:
    """`prog` (classic BPF rows) run on one x86-64 system call, as the kernel's seccomp would:
    "allow" or the errno it returns."""
    import struct

    from runner.judge import sandbox

    data = struct.pack("<iIQ", nr, sandbox.AUDIT_ARCH_X86_64, 0) + b"".join(
        struct.pack("<Q", a & (2 ** 64 - 1)) for a in (*args, *[0] * (6 - len(args))))
    a, pc = 0, 0
    for _ in range(len(prog)):
        code, jt, jf, k = prog[pc]
        if code == sandbox.LD_W_ABS:
            a, pc = struct.unpack_from("<I", data, k)[0], pc + 1
        elif code == sandbox.ALU_AND_K:
            a, pc = a & k, pc + 1
        elif code in (sandbox.JEQ_K, sandbox.JSET_K, sandbox.JGE_K):
            taken = a == k if code == sandbox.JEQ_K else (a & k) != 0 if code == sandbox.JSET_K else a >= k
            pc += 1 + (jt if taken else jf)
        elif code == sandbox.RET_K:
            return "allow" if k == sandbox.RET_ALLOW else k & 0xFFFF
        else:
            raise AssertionError(f"row {pc}: an instruction the program should not hold: {prog[pc]}")
    raise AssertionError("the program ran past its length")


def test_the_loaded_hosts_allow_list_decides_each_call_by_its_arguments():
    """The kernel host's third filter (sandbox.loop_only), run call by call: the loop's calls and a
    kernel's own needs allowed; clocks, path stats, deadlines and shared-memory futex operations but
    a wait refused (session 64: its review read the time five ways past a first version); no open,
    no stat at all (the census folder's times are the realtime clock when the host opened it:
    session 65's red team), and getdents64 only of the census's folder."""
    import errno

    from runner.judge import sandbox

    census = 7
    prog = sandbox._loop_program(census)
    assert all(i + 1 + max(r[1], r[2]) < len(prog) for i, r in enumerate(prog)
               if r[0] in (sandbox.JEQ_K, sandbox.JSET_K, sandbox.JGE_K))
    priv, bitset, realtime = 128, 9, 256
    cases = {
        "write": (1, ()), "futex WAIT, shared": (202, (0, 0)), "futex WAKE, private": (202, (0, 1 | priv)),
        "futex WAIT_BITSET, no timeout, realtime (a join)": (202, (0, bitset | realtime, 0, 0)),
        "futex CMP_REQUEUE, private": (202, (0, 4 | priv)), "futex WAIT, shared, relative timeout": (202, (0, 0, 0, 8)),
        "getdents64 of the census": (217, (census,)), "clock_nanosleep, relative": (230, (1, 0, 8)),
        "madvise DONTNEED": (28, (0, 4096, 4)), "ioctl TCGETS": (16, (1, 0x5401)), "clone": (56, ()),
        "tgkill (the census's stop)": (234, ()),
    }
    refused = {
        "clock_gettime": (228, ()), "gettimeofday": (96, ()), "times": (100, ()), "sysinfo": (99, ()),
        "prctl": (157, ()), "newfstatat": (262, ()), "statx": (332, ()), "fstat of stdout": (5, (1,)),
        "futex WAKE, shared": (202, (0, 1)), "futex CMP_REQUEUE, shared": (202, (0, 4)),
        "futex WAIT_BITSET with a deadline": (202, (0, bitset | priv, 0, 8)),
        "futex WAIT_BITSET, a deadline past 4 GiB": (202, (0, bitset, 0, 1 << 32)),
        "futex LOCK_PI with a deadline": (202, (0, 6 | priv, 0, 8)),
        "clock_nanosleep, absolute": (230, (1, 1, 8)), "madvise REMOVE": (28, (0, 4096, 9)),
        "madvise PAGEOUT": (28, (0, 4096, 21)), "ioctl TIOCSTI": (16, (0, 0x5412)), "mincore": (27, ()),
        "sched_setaffinity": (203, ()), "membarrier": (324, ()), "getpriority": (140, ()), "setsockopt": (54, ()),
        "openat": (257, ()), "open": (2, ()), "getdents64 of another folder": (217, (3,)),
        "fstat of the census": (5, (census,)),
    }
    got = {k: _decide(prog, nr, a) for k, (nr, a) in cases.items()}
    assert got == {k: "allow" for k in cases}, got
    got = {k: _decide(prog, nr, a) for k, (nr, a) in refused.items()}
    assert got == {k: errno.EPERM for k in refused}, got
    assert all(_decide(prog, nr) == "allow" for nr in sandbox.LOOP_ALLOW)


NO_FILES = textwrap.dedent("""
    import errno, os, threading
    from runner.judge import sandbox
    held = os.open("/proc/self/task", os.O_RDONLY | os.O_DIRECTORY)
    print("abi", sandbox.landlock_abi(), "in force", sandbox.no_files())
    tid = []
    t = threading.Thread(target=lambda: tid.append(threading.get_native_id()))
    t.start(); t.join()
    for path in ("/etc/hostname", f"/proc/self/task/{os.getpid()}/schedstat", "/proc/uptime", "/tmp"):
        try:
            os.close(os.open(path, os.O_RDONLY))
            print(path, "OPENED")
        except OSError as e:
            print(path, "refused", errno.errorcode[e.errno])
    print("held", os.fstat(held).st_nlink >= 3, len(os.listdir(held)) >= 1)
""")


def test_landlock_leaves_a_loaded_host_no_file_to_open():
    """The loaded host's Landlock layer (beneath its allow list, which refuses every open itself):
    no path at all, not even its own threads' /proc files (a thread's CPU time and the scheduler's
    clock to the nanosecond; session 64's layer granted them, for the census that read them);
    what was open before stays usable. Where the kernel has no Landlock it says so (0) and the
    allow list stands alone."""
    from runner.judge import sandbox

    r = subprocess.run([sys.executable, "-c", NO_FILES], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    abi = sandbox.landlock_abi()
    assert f"abi {abi} in force {abi if abi >= 1 else 0}" in r.stdout, r.stdout
    if abi >= 1:
        assert r.stdout.count("refused EACCES") == 4 and "OPENED" not in r.stdout, r.stdout
    else:
        assert "refused" not in r.stdout, r.stdout
    assert "held True True" in r.stdout, r.stdout
