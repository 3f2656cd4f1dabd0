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


@pytest.mark.parametrize("own_pid", [None, 4321])
def test_filter_program_is_well_formed(own_pid):
    from runner.judge import sandbox

    prog = sandbox._program(own_pid)
    if own_pid is not None:  # each call that names a process: 0 or the host's own pid, else EPERM
        assert sum(1 for r in prog if r == (sandbox.JEQ_K, 1, 0, own_pid)) == len(sandbox.PID_ARGS)
    for i, (code, jt, jf, k) in enumerate(prog):
        if code in (sandbox.JEQ_K, sandbox.JSET_K, sandbox.JGE_K):
            assert i + 1 + max(jt, jf) < len(prog), f"row {i} jumps past the end"
    assert prog[-1] == (sandbox.RET_K, 0, 0, sandbox.RET_ALLOW)
