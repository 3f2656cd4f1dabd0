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
