"""The confinement of command agents: a program the user names as the agent (a headless coding
agent, a script) runs under Linux Landlock and a seccomp filter, so that it can propose
candidates and nothing more.

An agent reward-hacks where it can. A command agent is a process of the user's: unconfined it
could rewrite the run's ledger and both its anchors (the chain has no key), the judge's own code
(a worker restarted after a fault imports it again), the spec, the compile cache, the Python
environment the workers import torch from, or stop the judge's processes while the incumbent is
timed. Under confinement it:

- reads and executes anything but /dev (`readable`: of it, the null, zero and random devices);
  it reads the ledger anyway, its history is given to it as data;
- writes only in its own folder (a fresh one under the temporary folder unless the spec names
  one; PIPE_AGENT_WORKDIR, its TMPDIR inside it), the folders the spec lists in
  `agent.options.writable` (none may hold or lie inside what the runner owns, `owned_paths`,
  `clash`; nor lie where a careless spec could put them, `unsafe`; nor inside another) and
  /dev/null, and there makes no device node and ioctls no device;
- holds no capability, even when the driver runs as root (`drop_capabilities`);
- neither signals, traces nor reads the memory of any process outside its own tree (Landlock's
  scopes, and ptrace), nor changes another's scheduling, priority or limits (the filter);
- connects over TCP only to the ports in `agent.options.connect_ports` (443 and 80 unless the
  spec says otherwise: a model's API) and binds none, so a Ray cluster's or any local service's
  ports are closed;
- makes no unix socket and no socket but TCP or UDP over IP and netlink, no SysV IPC object or
  message queue, no namespace; uses no keyring; sets no clock; changes no file's owner, mode,
  extended attributes or flags (`filter_rows`, whose comment lists every refusal and why);
- leaves nothing running: the trampoline is the agent's subreaper and kills every descendant
  still alive when the agent exits or its time runs out (`sweep`).

The trampoline runs as `python -I -S confine.py CONFIG -- ARGV...`: no site, no environment
paths, the standard library only. It opens the writable folders (each must be the folder the run
set up: `open_folders`) and forks; the child drops its capabilities and restricts itself (for
good: the restriction is inherited and can never be lifted) and runs the agent; the trampoline,
outside the agent's domain and so out of its reach, waits for it and sweeps the tree.

Landlock's ABI 6 (Linux 6.12) is the least that confines signals; where the kernel offers less,
the command agent is refused unless the spec sets `agent.options.confine: false`, which the run
records and `pipe show` and `pipe report` print. Three red teams of session 42 shaped this
(datasets/judge-redteam/s42-jail*).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time

MIN_ABI = 6  # signals scoped (6.12); the filesystem since 1, TCP ports since 4, device ioctls since 5


def _sandbox():
    """judge/sandbox.py (the Landlock primitives, shared with the kernel hosts), loaded from its
    file: this file also runs as the trampoline (`python -I -S confine.py`), where pipe's package
    is not on the path."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "judge", "sandbox.py")
    spec = importlib.util.spec_from_file_location("pipe_confine_sandbox", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_SB = _sandbox()
SYS_CREATE_RULESET = _SB.SYS_LANDLOCK_CREATE_RULESET
SYS_ADD_RULE, SYS_RESTRICT_SELF = _SB.SYS_LANDLOCK_ADD_RULE, _SB.SYS_LANDLOCK_RESTRICT_SELF
RULE_PATH_BENEATH, RULE_NET_PORT = _SB.LANDLOCK_RULE_PATH_BENEATH, 2
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


fs_rights = _SB.landlock_fs_rights  # every filesystem right the ABI knows: all handled


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


abi = _SB.landlock_abi  # the kernel's Landlock ABI version; 0 where there is none


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


_RulesetAttr, _PathBeneath = _SB.LandlockRuleset, _SB.LandlockBeneath


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


DEVICES_READ = ("/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def readable(handled: int) -> list[tuple[str, int]]:
    """(path, rights) the agent reads through: every entry of / but /dev (a terminal of the
    user's is readable there, keystrokes and all: the s42 red team's second pass read a line
    typed into another pty), the folders of / listed, and of /dev the null, zero and random
    devices (/dev/null written too)."""
    out = [("/", FS_READ_DIR)]
    for name in sorted(os.listdir("/")):
        if name != "dev":
            out.append((f"/{name}", READ))
    out += [(d, FS_READ_FILE) for d in DEVICES_READ]
    out.append(("/dev/null", (FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE) & handled))
    return out


def restrict_self(writable: list[int], ports: list[int] | None, version: int | None = None) -> None:
    """Restricts this process and everything it starts from now on: read and execute anywhere but
    /dev (`readable`), write under the folders `writable` (descriptors opened before, so that no path is looked up
    again) and to /dev/null, but make no device node and ioctl no device there; TCP
    connections to `ports` only (None: any) and no TCP port bound; no signal or abstract unix
    socket beyond its own domain. Raises OSError."""
    libc = _libc()
    v = version or abi()
    if v < 1:
        raise OSError("no Landlock")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    handled = fs_rights(v)
    net = (NET_BIND_TCP | (NET_CONNECT_TCP if ports is not None else 0)) if v >= 4 else 0
    attr = _RulesetAttr(handled, net, (SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET) if v >= 6 else 0)
    size = 24 if v >= 6 else 16 if v >= 4 else 8
    fd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        def rule(pfd: int, rights: int, what: str) -> None:
            r = _PathBeneath(rights, pfd)
            if libc.syscall(SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(RULE_PATH_BENEATH),
                            ctypes.byref(r), ctypes.c_uint32(0)) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule({what})")

        for path, rights in readable(handled):
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:  # gone since it was listed, or a link to nothing
                continue
            try:
                if not os.path.isdir(f"/proc/self/fd/{pfd}"):
                    rights &= FILE_RIGHTS  # a file takes no folder's rights
                rule(pfd, rights, path)
            finally:
                os.close(pfd)
        own = handled & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK | FS_IOCTL_DEV)  # a node of its own reaches any device
        for w in writable:
            rule(w, own, f"folder {w}")
        if v >= 4 and ports is not None:
            for p in ports:
                r = _NetPort(NET_CONNECT_TCP, int(p))
                if libc.syscall(SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(RULE_NET_PORT),
                                ctypes.byref(r), ctypes.c_uint32(0)) != 0:
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
    add("/dev", "holds the devices (the GPU among them)")
    add("/proc", "is the processes' own files")
    add("/sys", "is the kernel's settings")
    # what the compilers and the system read (a header in /usr/local/include comes before
    # /usr/include): no folder inside them either
    for p in ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib64", "/boot", "/var/lib",
              os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if p and os.path.isdir(p):
            add(p, "is the system's (its compilers' headers and libraries among it)")
    # what the judge's processes read where the environment says: bytecode, headers, libraries,
    # compilers and tools' caches (an agent given a writable folder that PYTHONPYCACHEPREFIX named
    # wrote a .pyc of the judge's figures module there and its metric went into the ledger times
    # 100, the chain intact: session 66's red team); PATH and the compiler's own folder too
    for var in ENV_PATHS:
        for p in os.environ.get(var, "").split(os.pathsep):
            if p and os.path.isabs(p) and os.path.isdir(p):
                # PATH: programs are looked up in the folder itself, not below it
                add(p, (HOLDS_ONLY if var == "PATH" else "") + f"is named by ${var}, which the judge's processes read")
    for tool in (os.environ.get("CXX") or "g++", os.environ.get("CC") or "cc", "nvcc"):
        found = shutil.which(tool)
        if found:
            add(Path(found).resolve().parent, f"holds {tool}, which the judge compiles with")
    # folders that hold what the runner makes while it runs (the CPU backend compiles each
    # candidate in a folder of its own under the temporary folder): one inside them is the
    # agent's own, one that holds them is not
    out.append((Path(tempfile.gettempdir()).resolve(), HOLDS_ONLY + "holds the judge's build folders"))
    out.append((Path.home().resolve(), HOLDS_ONLY + "is the home folder (pipe's cache and the user's environment)"))
    out.append((Path("/").resolve(), HOLDS_ONLY + "is the whole filesystem"))
    return out


HOLDS_ONLY = "\0"  # an owned entry a folder may lie inside, but not hold or be
# environment variables whose folders the judge's processes read (owned_paths)
ENV_PATHS = ("PATH", "PYTHONPYCACHEPREFIX", "PYTHONHOME", "PYTHONUSERBASE", "CPATH", "C_INCLUDE_PATH",
             "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "LD_LIBRARY_PATH", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
             "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR", "CUDA_CACHE_PATH", "XDG_CACHE_HOME",
             "CUDA_HOME", "CUDA_PATH")


def clash(path, owned) -> str | None:
    """Why a folder the agent would write may not be (it holds or lies inside what the runner
    owns), or None."""
    for p, what in owned:
        inside_ok = what.startswith(HOLDS_ONLY)
        what = what.removeprefix(HOLDS_ONLY)
        if path == p:
            return f"{what}"
        if p in path.parents and not inside_ok:
            return f"lies inside {p}, which {what}"
        if path in p.parents:
            return f"holds {p}, which {what}"
    return None


TOOL_CACHES = ("torchinductor_", "triton", "pipe-cpu-", "pipe-actor-", "pipe-artifacts-", "ray")


def unsafe(path) -> str | None:
    """Why a folder is no place for the agent to write, whatever the run owns (the s42 red team's
    second pass: a careless spec could name these), or None: a git repository's own folder (its
    hooks run at the user's next commit), a run folder of pipe's or one holding one (its ledger),
    a hidden folder of the home folder (the user's configuration, keys, and the caches of
    Triton, CUDA and pipe), a tool's cache under the temporary folder (torch.compile's, which
    `baseline: compile` runs)."""
    from pathlib import Path

    path = Path(path)
    if ".git" in path.parts:
        return "lies inside a git repository's own folder (.git: its hooks run at the next commit)"
    for p in (path, *path.parents):
        if (p / "ledger.db").exists():
            return f"lies inside {p}, a run folder of pipe's (its ledger)"
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            if "ledger.db" in files:
                return f"holds {root}, a run folder of pipe's (its ledger)"
            if Path(root).relative_to(path).parts.__len__() >= 3:
                dirs[:] = []
    home = Path.home().resolve()
    if home in path.parents and path.relative_to(home).parts[0].startswith("."):
        return f"lies inside {home / path.relative_to(home).parts[0]}, a hidden folder of the home folder"
    tmp = Path(tempfile.gettempdir()).resolve()
    if tmp in path.parents and path.relative_to(tmp).parts[0].startswith(TOOL_CACHES):
        return f"lies inside {tmp / path.relative_to(tmp).parts[0]}, a cache or build folder of the tools"
    return None


def nested(folders) -> str | None:
    """Why folders the agent may write cannot all be given (one inside another: a folder it
    could replace by a link between two calls), or None."""
    for a in folders:
        for b in folders:
            if a != b and a in b.parents:
                return f"{b} lies inside {a}, which the agent may also write: give one of them"
    return None


# seccomp, beside Landlock: what Landlock does not mediate (s42 red team, datasets/judge-redteam/
# s42-jail). Refused with EPERM:
# - a unix socket (socketpair, already connected, stays): connect() to one with a path (systemd's
#   user manager, docker, tmux, X, a Ray node's raylet) is no Landlock right, and several of
#   those run a command for whoever connects; any socket but TCP or UDP over IPv4 or IPv6 and
#   netlink (MPTCP and SCTP reach the ports Landlock's TCP rule closes); io_uring, whose socket
#   and connect operations never pass through the filter;
# - another process's scheduling, priority, CPU set, I/O priority or limits (the judge's worker
#   set to SCHED_IDLE, pinned, given a CPU-time limit it had already used: a fault for a verdict);
# - tracing and reading other processes (ptrace, process_vm_*, perf events, BPF, kcmp, pidfd_getfd);
# - the clock's rate and time (adjtimex: the judge's monotonic clock up to 10% off), reboot,
#   modules, kexec, swap, accounting, entering another namespace;
# - SysV IPC objects and message queues, which outlive the agent (a 64 MiB segment was left
#   behind), the keyrings (the user's session keyring is inherited: a key was read and revoked),
#   new namespaces, clone3 (ENOSYS: its flags are in memory, CLONE_INTO_CGROUP among them);
# - a session or process group of its own (setsid, setpgid): every process the agent starts
#   stays in the one group the trampoline gave it, which one kill ends at once, forks in flight
#   included; a process that left it (setsid) and forked its successor and exited, over and
#   over, outran the walk of the tree, lived past the sweep and the run, and ran through later
#   trials' timings (session 66's red team);
# - device nodes, file owners, modes and extended attributes, the immutable flag (a root agent
#   locked the ledger through a read-only descriptor) and TIOCSTI (keys typed into a terminal). A
#   file's owner may change its mode without any write right (Landlock has none for it): an
#   agent run by root owns the system's files (mode 000 on the spec, 0666 on /etc/passwd), one
#   run by a user the run folder's; the agent writes a file with the mode it needs instead.
_NR = {  # per architecture: the audit arch, then the system calls by name
    "x86_64": (0xC000003E, {
        "socket": 41, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "perf_event_open": 298,
        "bpf": 321, "kcmp": 312, "pidfd_getfd": 438, "process_madvise": 440, "adjtimex": 159,
        "clock_adjtime": 305, "clock_settime": 227, "settimeofday": 164, "reboot": 169, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "swapon": 167,
        "swapoff": 168, "acct": 163, "setns": 308, "mknod": 133, "mknodat": 259, "chown": 92, "fchown": 93,
        "lchown": 94, "fchownat": 260, "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452,
        "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190,
        "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199, "setxattrat": 463, "removexattrat": 466,
        "setpriority": 141, "ioprio_set": 251, "sched_setaffinity": 203, "sched_setscheduler": 144,
        "sched_setparam": 142, "sched_setattr": 314, "prlimit64": 302, "ioctl": 16, "capset": 126,
        "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240, "keyctl": 250, "add_key": 248,
        "request_key": 249, "file_setattr": 469, "unshare": 272, "open_by_handle_at": 304,
        "fanotify_init": 300, "clone": 56, "clone3": 435, "setsid": 112, "setpgid": 109}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "perf_event_open": 241,
        "bpf": 280, "kcmp": 272, "pidfd_getfd": 438, "process_madvise": 440, "adjtimex": 171,
        "clock_adjtime": 266, "clock_settime": 112, "settimeofday": 170, "reboot": 142, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "swapon": 224,
        "swapoff": 225, "acct": 89, "setns": 268, "mknodat": 33, "fchown": 55, "fchownat": 54, "fchmod": 52,
        "fchmodat": 53, "fchmodat2": 452,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
        "fremovexattr": 16, "setxattrat": 463, "removexattrat": 466, "setpriority": 140, "ioprio_set": 30,
        "sched_setaffinity": 122, "sched_setscheduler": 119, "sched_setparam": 118, "sched_setattr": 274,
        "prlimit64": 261, "ioctl": 29, "capset": 91, "shmget": 194, "semget": 190, "msgget": 186,
        "mq_open": 180, "keyctl": 219, "add_key": 217, "request_key": 218, "file_setattr": 469,
        "unshare": 97, "open_by_handle_at": 265, "fanotify_init": 262, "clone": 220, "clone3": 435,
        "setsid": 157, "setpgid": 154}),
}
_NR["AMD64"], _NR["arm64"] = _NR["x86_64"], _NR["aarch64"]
REFUSED = ("io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace", "process_vm_readv",
           "process_vm_writev", "perf_event_open", "bpf", "kcmp", "pidfd_getfd", "process_madvise", "adjtimex",
           "clock_adjtime", "clock_settime", "settimeofday", "reboot", "init_module", "finit_module",
           "delete_module", "kexec_load", "kexec_file_load", "swapon", "swapoff", "acct", "setns", "mknod",
           "mknodat", "chown", "fchown", "lchown", "fchownat", "chmod", "fchmod", "fchmodat", "fchmodat2",
           "setxattr", "lsetxattr", "fsetxattr",
           "removexattr", "lremovexattr", "fremovexattr", "setxattrat", "removexattrat", "shmget", "semget", "msgget", "mq_open", "keyctl", "add_key",
           "request_key", "file_setattr", "unshare", "open_by_handle_at", "fanotify_init", "setsid", "setpgid")
SELF_ONLY = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr", "prlimit64")  # pid 0
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM, SOCK_DGRAM = 1, 2
IP_PROTOCOLS = (0, 6, 17)  # default, TCP, UDP
# ioctls: TIOCSTI (keys typed into a terminal) and two families, whole: 'f' (0x66: file flags,
# fscrypt policies and keys, fs-verity; a policy set on an empty folder of the agent's uid
# through a read-only descriptor made the judge's writes there fail) and 'X' (0x58: the
# project quota attributes, freeze, thaw), but for the two reads a copy may ask for
IOCTLS_REFUSED = (0x5412, 0x4008941A)  # TIOCSTI, BTRFS_IOC_SUBVOL_SETFLAGS
IOCTLS_ALLOWED = (0x80086601, 0xC020660B)  # FS_IOC_GETFLAGS, FS_IOC_FIEMAP
IOCTL_FAMILIES_REFUSED = (0x6600, 0x5800)
CLONE_NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_JSET_K, _ENOSYS = 0x45, 0x00050000 | 38
_LD_W_ABS, _JEQ_K, _JGE_K, _AND_K, _RET_K = 0x20, 0x15, 0x35, 0x54, 0x06
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_CAPBSET_DROP = 47, 4, 24


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def _assemble(prog: list) -> list[tuple[int, int, int, int]]:
    """Rows from a program whose jumps name labels (a str row is a label; a jump's target None is
    the next row); BPF's jumps are relative and at most 255 rows."""
    at, n = {}, 0
    for r in prog:
        if isinstance(r, str):
            at[r] = n
        else:
            n += 1
    out, i = [], 0
    for r in prog:
        if isinstance(r, str):
            continue
        code, jt, jf, k = r
        rel = [0 if t is None else at[t] - i - 1 for t in (jt, jf)]
        assert all(0 <= x < 256 for x in rel), (r, rel)
        out.append((code, rel[0], rel[1], k))
        i += 1
    return out


def filter_rows(machine: str | None = None) -> list[tuple[int, int, int, int]]:
    """The agent's seccomp filter as (code, jt, jf, k) rows (see the comment above)."""
    arch, nr = _NR[machine or platform.machine()]
    arg = lambda i: (_LD_W_ABS, None, None, 16 + 8 * i)  # noqa: E731 - an argument's low word
    p: list = [(_LD_W_ABS, None, None, 4), (_JEQ_K, None, "deny", arch),  # i386 through int 0x80: no
               (_LD_W_ABS, None, None, 0), (_JGE_K, "deny", None, 0x40000000)]  # x32 numbers: no
    p += [(_JEQ_K, "deny", None, nr[name]) for name in REFUSED if name in nr]
    p += [(_JEQ_K, "self", None, nr[name]) for name in SELF_ONLY]
    p += [(_JEQ_K, "setpriority", None, nr["setpriority"]), (_JEQ_K, "ioprio", None, nr["ioprio_set"]),
          (_JEQ_K, "socket", None, nr["socket"]), (_JEQ_K, "ioctl", None, nr["ioctl"]),
          (_JEQ_K, "clone", None, nr["clone"]), (_JEQ_K, "enosys", None, nr["clone3"]),
          (_RET_K, None, None, _ALLOW)]
    # clone3 -> ENOSYS (libc falls back to clone, whose flags the filter can read: clone3's sit in
    # memory, CLONE_INTO_CGROUP among them); no new namespace
    p += ["enosys", (_RET_K, None, None, _ENOSYS)]
    p += ["clone", arg(0), (_JSET_K, "deny", "allow", CLONE_NEW_NAMESPACES)]
    p += ["self", arg(0), (_JEQ_K, "allow", "deny", 0)]
    p += ["setpriority", arg(0), (_JEQ_K, None, "deny", 0), arg(1), (_JEQ_K, "allow", "deny", 0)]  # PRIO_PROCESS, self
    p += ["ioprio", arg(0), (_JEQ_K, None, "deny", 1), arg(1), (_JEQ_K, "allow", "deny", 0)]  # IOPRIO_WHO_PROCESS, self
    p += ["socket", arg(0), (_JEQ_K, "allow", None, AF_NETLINK), (_JEQ_K, "inet", None, AF_INET),
          (_JEQ_K, "inet", "deny", AF_INET6),
          "inet", arg(1), (_AND_K, None, None, 0xF), (_JEQ_K, "proto", None, SOCK_STREAM),
          (_JEQ_K, "proto", "deny", SOCK_DGRAM),
          "proto", arg(2)]
    p += [(_JEQ_K, "allow", None, k) for k in IP_PROTOCOLS] + [(_RET_K, None, None, _EPERM)]
    p += ["ioctl", arg(1)] + [(_JEQ_K, "deny", None, k) for k in IOCTLS_REFUSED]
    p += [(_JEQ_K, "allow", None, k) for k in IOCTLS_ALLOWED] + [(_AND_K, None, None, 0xFF00)]
    p += [(_JEQ_K, "deny", None, k) for k in IOCTL_FAMILIES_REFUSED] + [(_RET_K, None, None, _ALLOW)]
    p += ["deny", (_RET_K, None, None, _EPERM), "allow", (_RET_K, None, None, _ALLOW)]
    return _assemble(p)


def seccomp_filter(rows=None) -> None:
    """Stacks filter_rows() on this process (no_new_privs must be set); OSError otherwise."""
    rows = rows or filter_rows()
    arr = (_Filter * len(rows))(*[_Filter(*r) for r in rows])
    prog = _Prog(len(rows), arr)
    if _libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """No capability left, and none to be had again (an agent run by root would keep CAP_MKNOD,
    CAP_SYS_TIME, CAP_SYS_NICE, CAP_LINUX_IMMUTABLE, ...: the s42 red team reached the raw disk
    through a device node it made). The ambient and bounding sets are emptied where this process
    may (root), then the effective, permitted and inheritable ones; with no_new_privs, nothing
    the agent executes gains one back. OSError if any is left."""
    libc = _libc()
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: nothing to drop then
    hdr, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    if libc.syscall(_NR[platform.machine()][1]["capset"], ctypes.byref(hdr), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    with open("/proc/self/status") as f:
        eff = next((ln.split()[1] for ln in f if ln.startswith("CapEff:")), "0")
    if int(eff, 16):
        raise OSError(f"capabilities left: {eff}")


# -- the trampoline ---------------------------------------------------------------------------

def _children(pid: int | str = "self") -> list[int]:
    """The children of every thread of `pid` (a process started from a second thread is that
    thread's child, not the main thread's: the s42 red team's second pass hid a chain of 260
    that way, one level a round)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def _descendants() -> list[int]:
    """Every live process under this one (those whose parents died were reparented to it)."""
    seen: set[int] = set()
    order, todo = [], _children()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        order.append(pid)
        todo += _children(pid)
    return order


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


SWEEP_S = 30.0  # at most this long to empty the tree


def _stat(pid) -> list[str] | None:
    """A process's /proc stat fields after its name (state first), or None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def pgid_of(pid: int) -> int | None:
    """A process's group (by /proc), or None where it is gone."""
    st = _stat(pid)
    return int(st[2]) if st and len(st) > 2 else None


def _group(pgid: int | None) -> list[int]:
    """The live members of a process group (its id: the agent's pid), by /proc."""
    if not pgid:
        return []
    return [int(d) for d in os.listdir("/proc")
            if d.isdigit() and (st := _stat(d)) and len(st) > 2 and st[2] == str(pgid) and st[0] != "Z"]


def sweep(limit_s: float = SWEEP_S, group: int | None = None) -> int:
    """Kills every descendant and reaps them, until none is left (or `limit_s` passes); the
    number killed. The agent's process group (`group`: no process of the agent can leave it)
    is killed first, in one step: the kernel delivers a group's signal to a child forked while
    it is sent as well, so nothing that forks and exits over and over outruns it. Then the tree
    is frozen: every process found is stopped, and the walk is repeated until it finds no
    process it has not stopped (a stopped process starts no other), then all are killed at once;
    what a process started while it was being stopped is reparented here and caught by the next
    pass."""
    killed: set[int] = set(_group(group))  # (none: its id may be another's by now)
    if killed:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            killed.clear()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        stopped: set[int] = set()
        while time.monotonic() < deadline:
            new = [p for p in _descendants() if p not in stopped]
            if not new:
                break
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass
                stopped.add(pid)
        if not stopped:
            break
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.001)
        _reap()
    _reap()
    return len(killed)


def open_folders(folders: list[dict]) -> list[int]:
    """Descriptors of the folders the agent may write, each the very folder the run was set up
    with (`{"path", "dev", "ino"}`): a folder swapped for a link to another between two calls
    (the s42 red team pointed one at the run folder) is refused, never followed. OSError."""
    fds = []
    for f in folders:
        fd = os.open(f["path"], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (f["dev"], f["ino"]):
            os.close(fd)
            raise OSError(f"{f['path']} is not the folder the run set up for the agent (replaced, or a link "
                          "to another): refused")
        fds.append(fd)
    return fds


def trampoline(config: dict, argv: list[str]) -> int:
    """Runs `argv` confined and returns its exit code (KILLED_ON_TIMEOUT, CANNOT_CONFINE). This
    process stays outside the agent's domain (it restricts only the child it forks), so the agent
    can neither signal nor trace it; as the agent's subreaper it kills every process the agent
    left alive when the agent exits or its time runs out."""
    libc = _libc()
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    try:
        fds = open_folders(config["writable"])
    except OSError as e:
        sys.stderr.write(f"pipe: cannot confine the agent: {e}\n")
        return CANNOT_CONFINE
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the agent: restricted here, then the command
        os.close(r)
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            os.setpgid(0, 0)  # a process group of the agent's own (its pid), which it cannot leave
            drop_capabilities()
            restrict_self(fds, config.get("ports"), config.get("abi"))
            seccomp_filter()
            for fd in fds:
                os.close(fd)
            if config.get("cwd"):
                os.chdir(config["cwd"])
        except OSError as e:
            os.write(w, f"cannot confine the agent: {e}".encode())
            os._exit(CANNOT_CONFINE)
        os.set_inheritable(w, False)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            sys.stderr.write(f"cannot run {argv[0]}: {e}\n")
        os._exit(127)
    os.close(w)
    for fd in fds:
        os.close(fd)
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
                sweep(group=pid)
                os.close(r)
                return KILLED_ON_TIMEOUT
            time.sleep(0.005)
    why = os.read(r, 4096).decode(errors="replace")
    os.close(r)
    if code == CANNOT_CONFINE and why:
        sys.stderr.write(f"pipe: {why}\n")
        sweep(group=pid)
        return CANNOT_CONFINE
    left = sweep(group=pid)
    if left:
        sys.stderr.write(f"pipe: {left} processes the agent left running were killed\n")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sep = sys.argv.index("--")
    sys.exit(trampoline(json.loads(sys.argv[1]), sys.argv[sep + 1:]))
