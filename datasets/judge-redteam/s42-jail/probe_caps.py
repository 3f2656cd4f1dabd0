"""Agent-side battery: what a Landlocked agent can still do that Landlock does not cover.
Run INSIDE the trampoline. argv: victim_pid victim_file unix_sock udp_port tcp_port abstract_name
Every probe aims at the harness's own victim process/file (never at anything else); the ones that
change state are either no-ops (same value set again) or are reverted by check.py afterwards.
Prints one JSON object: probe -> "ok ..." or errno name."""
import ctypes, errno, json, os, signal, socket, struct, sys, time

victim, vfile, usock, udp_port, tcp_port, abstract = sys.argv[1:7]
victim, udp_port, tcp_port = int(victim), int(udp_port), int(tcp_port)
os.chdir(os.environ.get("PIPE_AGENT_WORKDIR", "."))  # its own folder (the trampoline keeps the user's cwd)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}


def t(name, f):
    try:
        r = f()
        out[name] = "ok" + (f" {r}" if r is not None else "")
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
    except Exception as e:  # noqa
        out[name] = f"{type(e).__name__}: {e}"


def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *args)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


me = os.getpid()
tramp = os.getppid()
out["ids"] = f"uid={os.getuid()} euid={os.geteuid()} caps={open('/proc/self/status').read().split('CapEff:')[1].split()[0]}"
import resource
out["rlimits"] = {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n))[0] for n in ("FSIZE", "AS", "NPROC", "NOFILE", "CPU")}

# -- controls (Landlock should block these) --
t("control_write_outside", lambda: open(vfile, "a").write("x"))
t("control_signal_victim", lambda: os.kill(victim, 0))
t("control_environ_victim", lambda: open(f"/proc/{victim}/environ", "rb").read(10))
t("control_mem_victim", lambda: open(f"/proc/{victim}/mem", "rb").read(1))
t("signal_trampoline_perm", lambda: os.kill(tramp, 0))  # same Landlock domain as the agent

# -- scheduling / resource tricks on a process outside the domain --
t("setpriority_victim", lambda: (os.setpriority(os.PRIO_PROCESS, victim, 7), os.getpriority(os.PRIO_PROCESS, victim))[1])
t("sched_setaffinity_victim", lambda: (os.sched_setaffinity(victim, {0}), os.sched_getaffinity(victim))[1])
t("sched_setscheduler_victim_idle", lambda: (os.sched_setscheduler(victim, os.SCHED_IDLE, os.sched_param(0)),
                                              os.sched_getscheduler(victim))[1])
IOPRIO_SET, IOPRIO_WHO_PROCESS = 251, 1
t("ioprio_set_victim_idle", lambda: sc(IOPRIO_SET, ctypes.c_int(IOPRIO_WHO_PROCESS), ctypes.c_int(victim),
                                       ctypes.c_int((3 << 13) | 0)))
t("prlimit_victim_nofile", lambda: (os.prlimit(victim, os.RLIMIT_NOFILE, (7, 7)) if hasattr(os, "prlimit") else
                                    __import__("resource").prlimit(victim, __import__("resource").RLIMIT_NOFILE, (7, 7))))
import resource
t("prlimit_victim_read", lambda: resource.prlimit(victim, resource.RLIMIT_NOFILE))

# -- metadata changes on a file outside the writable folders --
t("chmod_outside", lambda: (os.chmod(vfile, 0o000), oct(os.stat(vfile).st_mode & 0o777))[1])
t("chown_outside", lambda: (os.chown(vfile, 65534, 65534), os.stat(vfile).st_uid)[1])
t("utime_outside", lambda: (os.utime(vfile, (1, 1)), os.stat(vfile).st_mtime)[1])
t("setxattr_outside", lambda: os.setxattr(vfile, "user.pwned", b"1"))
t("setxattr_trusted_outside", lambda: os.setxattr(vfile, "trusted.pwned", b"1"))


def immutable():
    import fcntl
    FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602
    fd = os.open(vfile, os.O_RDONLY)
    try:
        buf = bytearray(8)
        fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
        flags = struct.unpack("l", buf)[0]
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("l", flags | 0x10))  # FS_IMMUTABLE_FL
        return "immutable flag set"
    finally:
        os.close(fd)


t("chattr_immutable_outside", immutable)


def lock():
    import fcntl
    fd = os.open(vfile, os.O_RDONLY)
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a read lock via a read-only fd (SQLite's SHARED)
    os.close(fd)


t("posix_read_lock_outside", lock)


def linkat():
    fd = os.open(vfile, os.O_RDONLY)
    AT_EMPTY_PATH, AT_FDCWD = 0x1000, -100
    r = libc.linkat(fd, b"", AT_FDCWD, b"hardlink", AT_EMPTY_PATH)
    os.close(fd)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, "")


t("linkat_empty_path_into_workdir", linkat)
t("link_into_workdir", lambda: os.link(vfile, "hardlink2"))

# -- sockets --
def unix_connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(usock)
    s.sendall(b"hello from the jail\n")
    s.close()


t("unix_pathname_connect", unix_connect)


def abstract_connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect("\0" + abstract)
    s.close()


t("control_unix_abstract_connect", abstract_connect)


def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"udp from the jail", ("127.0.0.1", udp_port))
    s.close()


t("udp_send", udp)
t("control_tcp_connect", lambda: socket.create_connection(("127.0.0.1", tcp_port), timeout=2).close())


def mptcp():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)  # IPPROTO_MPTCP
    s.settimeout(2)
    s.connect(("127.0.0.1", tcp_port))
    s.close()


t("mptcp_connect", mptcp)


def fastopen():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    s.sendto(b"tfo from the jail", 0x20000000, ("127.0.0.1", tcp_port))  # MSG_FASTOPEN
    time.sleep(0.2)
    s.close()


t("tcp_fastopen_sendto", fastopen)


def listen():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    p = s.getsockname()[1]
    s.close()
    return p


t("tcp_bind_listen", listen)

# -- namespaces / mounts --
import subprocess


def unshare_mount():
    r = subprocess.run(["unshare", "-U", "-m", "-r", "sh", "-c", "mount -t tmpfs x /tmp 2>&1; echo rc=$?"],
                       capture_output=True, text=True)
    return (r.stdout + r.stderr).strip().replace("\n", " | ")


t("unshare_user_mount", unshare_mount)
t("mount_direct", lambda: sc(165, b"x", b"/tmp", b"tmpfs", ctypes.c_ulong(0), None))

# -- device nodes in the workdir (FS_MAKE_CHAR/BLOCK and IOCTL_DEV are granted there) --
t("mknod_char_kmsg", lambda: (os.mknod("kmsg", 0o600 | 0o020000, os.makedev(1, 11)),
                              os.write(os.open("kmsg", os.O_WRONLY), b"<6>s42-jail: written through a device node made by a Landlocked agent\n"))[1])
t("control_open_dev_kmsg_w", lambda: os.open("/dev/kmsg", os.O_WRONLY))
loop = os.environ.get("S42_LOOP")  # a loop device check.py set up on a scratch image
if loop:
    st = os.stat(loop)

    def rawwrite():
        os.mknod("blk", 0o600 | 0o060000, st.st_rdev)
        fd = os.open("blk", os.O_WRONLY)
        os.pwrite(fd, b"S42-RAW-BLOCK-WRITE-FROM-JAIL", 1 << 20)
        os.fsync(fd)
        os.close(fd)
        return f"wrote 29 bytes at 1 MiB of {loop} ({os.major(st.st_rdev)}:{os.minor(st.st_rdev)})"

    t("control_open_loop_w", lambda: os.open(loop, os.O_WRONLY))
    t("mknod_block_loop_write", rawwrite)

# -- root-only capabilities Landlock does not gate (harmless probes) --
t("reboot_badmagic(EINVAL=permitted)", lambda: sc(169, ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0), None))
t("init_module_junk(ENOEXEC=permitted)", lambda: sc(175, ctypes.c_char_p(b"junkjunk"), ctypes.c_ulong(8), b""))


class Timex(ctypes.Structure):
    _fields_ = [("modes", ctypes.c_uint)] + [("f%d" % i, ctypes.c_long) for i in range(25)]


def adjtimex():
    tx = Timex()
    libc.adjtimex(ctypes.byref(tx))
    tick = tx.f10  # offset 0x50 / 8 - 1 ... tick is the 11th long after modes' padding
    tx2 = Timex()
    tx2.modes = 0x4000  # ADJ_TICK, set to its current value: a no-op that needs CAP_SYS_TIME
    tx2.f10 = tick
    r = libc.adjtimex(ctypes.byref(tx2))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "")
    return f"tick={tick} (could be set 9000..11000: +-10% CLOCK_MONOTONIC rate)"


t("adjtimex_set_tick_same", adjtimex)


def bpf_map():
    attr = (ctypes.c_uint32 * 32)()
    attr[0], attr[1], attr[2], attr[3] = 2, 4, 4, 1  # BPF_MAP_TYPE_ARRAY, key 4, value 4, 1 entry
    fd = sc(321, ctypes.c_int(0), ctypes.byref(attr), ctypes.c_uint(128))
    os.close(fd)


t("bpf_map_create", bpf_map)


def perf_cpu_wide():
    attr = (ctypes.c_uint8 * 128)()
    struct.pack_into("IIQ", attr, 0, 1, 128, 0)  # PERF_TYPE_SOFTWARE, size, PERF_COUNT_SW_CPU_CLOCK
    fd = sc(298, ctypes.byref(attr), ctypes.c_int(-1), ctypes.c_int(0), ctypes.c_int(-1), ctypes.c_ulong(0))
    os.close(fd)


t("perf_event_open_cpu_wide", perf_cpu_wide)
t("control_oom_score_adj", lambda: open("/proc/self/oom_score_adj", "w").write("-1000"))
t("control_cgroup_write", lambda: open("/sys/fs/cgroup/cgroup.procs", "w").write(str(me)))
print(json.dumps(out, indent=1))
