"""The confinement of command agents: a program the user names as the agent (a headless coding
agent, a script) runs under Linux Landlock, so that it can propose candidates and nothing more.

An agent reward-hacks where it can. A command agent is a process of the user's: unconfined it
could rewrite the run's ledger and both its anchors (the chain has no key), the judge's own code
(a worker restarted after a fault imports it again), the spec, the compile cache, the Python
environment the workers import torch from, or stop the judge's processes while the incumbent is
timed. Under confinement it may:

- read and execute files (it reads the ledger anyway: its history is given to it as data);
- write only inside its own working folder (a fresh one under the temporary folder unless the
  spec names one; its TMPDIR is inside it) and the folders the spec lists in
  `agent.options.writable`, neither of which may hold or lie inside what the runner owns
  (`protected`: the run folder, the spec and its template files, the runner's package, the
  Python environment, pipe's compile cache, /dev/shm), and /dev/null;
- not open a device but /dev/null for writing (so no GPU: its work would share the judge's),
  nor ioctl one;
- not signal, trace or read the memory of any process outside its own tree (Landlock's scopes:
  signals and abstract unix sockets; ptrace always), so the judge's workers and the driver are
  out of its reach;
- connect over TCP only to the ports in `agent.options.connect_ports` (443 and 80 unless the spec
  says otherwise: a model's API), so a Ray cluster's or any local service's ports are closed;
- make no unix socket (a seccomp filter): a socket with a path is reached by `connect`, which
  Landlock does not mediate, and several services behind one start a command for whoever
  connects (systemd's user manager, docker, tmux, a Ray node's raylet);
- leave nothing running: the trampoline below is the agent's subreaper and kills every
  descendant still alive when the agent exits or its time runs out.

The trampoline runs as `python -I -S confine.py CONFIG -- ARGV...`: no site, no environment
paths, the standard library only. It restricts itself (the restriction is inherited and can
never be lifted), forks the agent, waits for it, and sweeps the tree.

Landlock's ABI 6 (Linux 6.12) is the least that confines signals; where the kernel offers less,
the command agent is refused unless the spec sets `agent.options.confine: false`, which the run
records and `pipe show` reports.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import signal
import sys
import time

MIN_ABI = 6  # signals scoped (6.12); the filesystem since 1, TCP ports since 4, device ioctls since 5

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on x86-64 and arm64
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 38, 1, 36

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # all a file (not a folder) takes

DEFAULT_PORTS = (443, 80)
KILLED_ON_TIMEOUT = 124  # the trampoline's exit code when the agent's time ran out
CANNOT_CONFINE = 125  # ... when the restriction could not be made (its message on stderr)


def fs_rights(abi: int) -> int:
    """Every filesystem right the ABI knows: all handled, so none is allowed by default."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, too old a kernel,
    Landlock not among the kernel's security modules)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        return 0
    try:
        r = _libc().syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return int(r) if r > 0 else 0


def unavailable(need: int = MIN_ABI) -> str | None:
    """Why command agents cannot be confined here (None: they can)."""
    have = abi()
    if have >= need:
        return None
    if have == 0:
        return ("this machine's kernel offers no Landlock (Linux 5.13 or later, with landlock among the "
                "security modules: /sys/kernel/security/lsm)")
    return (f"this machine's kernel offers Landlock ABI {have}; confining a command agent's signals "
            f"needs ABI {need} (Linux 6.12 or later)")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def restrict_self(writable: list[str], ports: list[int] | None, version: int | None = None) -> None:
    """Restricts this process and everything it starts from now on: read and execute anywhere,
    write under `writable` (folders) and to /dev/null, TCP connections to `ports` only (None:
    any), no signal or abstract unix socket beyond its own domain. Raises OSError."""
    libc = _libc()
    v = version or abi()
    if v < 1:
        raise OSError("no Landlock")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    handled = fs_rights(v)
    attr = _RulesetAttr(handled, NET_CONNECT_TCP if v >= 4 and ports is not None else 0,
                        (SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET) if v >= 6 else 0)
    size = 24 if v >= 6 else 16 if v >= 4 else 8
    fd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        def allow(path: str, rights: int) -> None:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(rights, pfd)
                if libc.syscall(SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
            finally:
                os.close(pfd)

        allow("/", READ)
        allow("/dev/null", (FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE) & handled)
        for w in writable:
            allow(w, handled)
        if v >= 4 and ports is not None:
            for p in ports:
                rule = _NetPort(NET_CONNECT_TCP, int(p))
                if libc.syscall(SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(RULE_NET_PORT),
                                ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule(port {p})")
        if libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)


def owned_paths(spec, run_dir, cache=None) -> list:
    """What the runner owns and a command agent may never write: (path, what it is). `spec`,
    `run_dir` and `cache` (pipe's compile cache, build.backends.cache_dir: a room above this
    one gives it) may be None (an agent made outside a run)."""
    import site
    from pathlib import Path

    out: list[tuple[Path, str]] = []

    def add(p, what: str) -> None:
        if p:
            out.append((Path(p).expanduser().resolve(), what))

    if run_dir is not None:
        add(run_dir, "is the run folder")
    if spec is not None:
        add(spec.path, "is the spec")
        add(spec.home, "is the spec's folder (its reference modules and templates)")
        add(spec.kernel.template_path, "is the kernel template")
        add(getattr(spec.hw, "path", None), "is the hardware profile")
    import runner

    add(Path(runner.__file__).parent, "is the runner's package (the judge's code)")
    add(sys.prefix, "is the Python environment the judge imports from")
    add(sys.base_prefix, "is the Python installation the judge runs on")
    for p in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]:
        if p and os.path.isdir(p):
            add(p, "is on the judge's import path")
    add(cache, "is pipe's compile cache")
    add("/dev/shm", "holds shared memory of the judge's processes")
    return out


def clash(path, owned) -> str | None:
    """Why a folder the agent would write may not be (it holds or lies inside what the runner
    owns), or None."""
    for p, what in owned:
        if path == p:
            return f"{what}"
        if p in path.parents:
            return f"lies inside {p}, which {what}"
        if path in p.parents:
            return f"holds {p}, which {what}"
    return None


# seccomp, beside Landlock: what Landlock does not mediate. A unix socket with a path (systemd's
# user manager, docker, tmux, X, a Ray node's raylet and object store) is reached by connect(),
# which no Landlock right covers, and several of those run a command for whoever connects: out of
# the confinement. The agent may not make a unix socket (socketpair, already connected, stays);
# io_uring, whose socket and connect operations never pass through the filter, is refused too.
_ARCH = {"x86_64": (0xC000003E, 41, 425), "AMD64": (0xC000003E, 41, 425),
         "aarch64": (0xC00000B7, 198, 425), "arm64": (0xC00000B7, 198, 425)}  # (audit arch, socket, io_uring_setup)
AF_UNIX = 1
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def socket_rows() -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) rows: another ABI than the machine's own, socket(AF_UNIX)
    and io_uring_setup refused with EPERM; everything else allowed."""
    arch, sock, uring = _ARCH[platform.machine()]
    return [
        (_LD_W_ABS, 0, 0, 4), (_JEQ_K, 1, 0, arch), (_RET_K, 0, 0, _EPERM),  # i386 through int 0x80: no
        (_LD_W_ABS, 0, 0, 0), (_JGE_K, 0, 1, 0x40000000), (_RET_K, 0, 0, _EPERM),  # x32 numbers: no
        (_JEQ_K, 0, 1, uring), (_RET_K, 0, 0, _EPERM),
        (_JEQ_K, 0, 3, sock), (_LD_W_ABS, 0, 0, 16), (_JEQ_K, 0, 1, AF_UNIX), (_RET_K, 0, 0, _EPERM),
        (_RET_K, 0, 0, _ALLOW),
    ]


def no_unix_sockets() -> None:
    """Stacks socket_rows() on this process (no_new_privs must be set); OSError otherwise."""
    rows = socket_rows()
    arr = (_Filter * len(rows))(*[_Filter(*r) for r in rows])
    prog = _Prog(len(rows), arr)
    if _libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


# -- the trampoline ---------------------------------------------------------------------------

def _children() -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def _descendants() -> list[int]:
    """Every live process under this one (those whose parents died were reparented to it)."""
    seen, todo = [], _children()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.append(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return seen


def sweep(rounds: int = 200) -> int:
    """SIGKILLs every descendant, reaping them, until none is left; the number killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        pids = _descendants()
        if not pids:
            break
        for pid in pids:  # stopped first, so that none forks while its siblings die
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.001)
    return len(killed)


def trampoline(config: dict, argv: list[str]) -> int:
    libc = _libc()
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        restrict_self(list(config["writable"]), config.get("ports"), config.get("abi"))
        no_unix_sockets()
    except OSError as e:
        sys.stderr.write(f"pipe: cannot confine the agent: {e}\n")
        return CANNOT_CONFINE
    pid = os.fork()
    if pid == 0:
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if config.get("cwd"):
                os.chdir(config["cwd"])
            os.execvp(argv[0], argv)
        except OSError as e:
            sys.stderr.write(f"cannot run {argv[0]}: {e}\n")
        os._exit(127)
    deadline = time.monotonic() + float(config.get("timeout_s") or 1e9)
    code = None
    while code is None:
        try:
            got, status = os.waitpid(-1, os.WNOHANG)  # the agent, or one reparented to this subreaper
        except ChildProcessError:
            code = 127
            break
        if got == pid:
            code = os.waitstatus_to_exitcode(status)
        elif got == 0:
            if time.monotonic() > deadline:
                sweep()
                return KILLED_ON_TIMEOUT
            time.sleep(0.005)
    left = sweep()
    if left:
        sys.stderr.write(f"pipe: {left} processes the agent left running were killed\n")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sep = sys.argv.index("--")
    sys.exit(trampoline(json.loads(sys.argv[1]), sys.argv[sep + 1:]))
