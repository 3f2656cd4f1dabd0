"""Runs CONFINED (through the trampoline, see check_battery.py): one probe per syscall family the
seccomp filter of confine.py does not name. Prints one JSON line per probe. argv[1]: a JSON dict of
the scratch targets check_battery.py set up."""
import ctypes, errno, json, os, struct, sys, time

T = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}


def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *args)
    return r, (errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()) if r < 0 else "ok")


def probe(name):
    def deco(f):
        try:
            out[name] = f()
        except Exception as e:  # noqa
            out[name] = f"exception {type(e).__name__}: {e}"
        print(json.dumps({name: out[name]}), flush=True)
        return f
    return deco


@probe("whoami")
def _():
    st = open("/proc/self/status").read()
    return {k: v for k, v in (ln.split(":\t", 1) for ln in st.splitlines()) if k in ("Uid", "CapEff", "CapBnd", "Seccomp", "NoNewPrivs")}


# ---- persistent objects that outlive the process (the sweep only kills processes) -------------
@probe("sysv_shm_left_behind")
def _():
    IPC_CREAT, IPC_PRIVATE = 0o1000, 0
    size = T["shm_mb"] << 20
    libc.shmget.restype = ctypes.c_int
    sid = libc.shmget(ctypes.c_int(0x5342_0042), ctypes.c_size_t(size), ctypes.c_int(IPC_CREAT | 0o600))
    if sid < 0:
        return f"shmget {errno.errorcode[ctypes.get_errno()]}"
    libc.shmat.restype = ctypes.c_void_p
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 0x5A, size)  # the pages are now allocated (shmem), counted nowhere of ours
    libc.shmdt(ctypes.c_void_p(addr))
    return f"segment id {sid}, {T['shm_mb']} MiB touched, detached, NOT removed"


@probe("posix_mqueue_left_behind")
def _():
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
    rt.mq_open.restype = ctypes.c_int
    q = rt.mq_open(b"/s42jail2", os.O_CREAT | os.O_WRONLY, 0o600, None)
    if q < 0:
        return f"mq_open {errno.errorcode[ctypes.get_errno()]}"
    rt.mq_send(q, b"left by the agent", 17, 0)
    return "queue /s42jail2 created with one message"


@probe("keyring_read_and_revoke")
def _():
    # the session keyring is the driver's (inherited): find the key the 'user' put there
    KEYCTL_SEARCH, KEYCTL_READ, KEYCTL_REVOKE, KEY_SPEC_SESSION_KEYRING = 10, 11, 3, -3
    kid, e = sc(250, KEYCTL_SEARCH, KEY_SPEC_SESSION_KEYRING, b"user", b"s42jail2-secret", 0)
    if kid < 0:
        return f"search {e}"
    buf = ctypes.create_string_buffer(256)
    n, e = sc(250, KEYCTL_READ, kid, buf, 256)
    secret = buf.raw[:n].decode() if n > 0 else e
    r, e2 = sc(250, KEYCTL_REVOKE, kid)
    return {"read": secret, "revoke": e2}


# ---- metadata the filter means to forbid ("no file's ... flags") --------------------------------
@probe("ioctl_FS_IOC_FSSETXATTR(control)")
def _():
    import fcntl
    fd = os.open(T["victim_file"], os.O_RDONLY)
    try:
        fcntl.ioctl(fd, 0x401C5820, b"\0" * 28)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
    finally:
        os.close(fd)


@probe("file_setattr_469_flags")
def _():
    # struct file_attr {u64 fa_xflags, fa_extsize, fa_nextents, fa_projid, fa_cowextsize}
    FS_XFLAG_SYNC, FS_XFLAG_NOATIME, FS_XFLAG_NODUMP = 0x20, 0x40, 0x80
    attr = struct.pack("Q4I", FS_XFLAG_SYNC | FS_XFLAG_NOATIME | FS_XFLAG_NODUMP, 0, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, 24)
    AT_FDCWD = -100
    r, e = sc(469, AT_FDCWD, T["victim_file"].encode(), buf, ctypes.c_size_t(24), 0)
    r2, e2 = sc(469, AT_FDCWD, T["victim_file"].encode(),
                ctypes.create_string_buffer(struct.pack("Q4I", 0x10, 0, 0, 0, 0), 24), ctypes.c_size_t(24), 0)
    return {"sync|noatime|nodump": e, "immutable(0x8)": sc(469, AT_FDCWD, T["victim_file"].encode(),
            ctypes.create_string_buffer(struct.pack("Q4I", 0x8, 0, 0, 0, 0), 24), ctypes.c_size_t(24), 0)[1],
            "append(0x10)": e2}


@probe("utimensat_victim")
def _():
    os.utime(T["victim_file"], (1e9, 1e9))
    return f"mtime now {os.stat(T['victim_file']).st_mtime}"


@probe("fscrypt_policy_on_empty_dir")
def _():
    import fcntl
    d = T.get("crypt_dir")
    if not d:
        return "no scratch ext4 (skipped)"
    # struct fscrypt_policy_v1 {version=0, contents=1 (AES_256_XTS), filenames=4 (AES_256_CTS), flags, key[8]}
    pol = struct.pack("BBBB8s", 0, 1, 4, 0, b"s42jail2")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, 0x800C6613, pol)  # FS_IOC_SET_ENCRYPTION_POLICY (_IOR('f', 19, v1 policy))
        return "policy set through a read-only descriptor"
    except OSError as e:
        return errno.errorcode[e.errno]
    finally:
        os.close(fd)


# ---- namespaces, cgroups ------------------------------------------------------------------------
@probe("unshare_user_pid_net")
def _():
    CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x20000000, 0x40000000, 0x20000
    r = {}
    pid = os.fork()
    if pid == 0:
        rc = libc.unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS)
        os._exit(0 if rc == 0 else 10 + ctypes.get_errno())
    r["unshare"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return r


@probe("clone3_into_cgroup")
def _():
    cg = T.get("cgroup")
    if not cg:
        return "skipped"
    CLONE_INTO_CGROUP = 0x200000000
    fd = os.open(cg, os.O_RDONLY | os.O_DIRECTORY)
    args = struct.pack("QQQQQQQQQQQ", CLONE_INTO_CGROUP, 0, 0, 0, 17, 0, 0, 0, 0, 0, fd)
    buf = ctypes.create_string_buffer(args, len(args))
    pid = libc.syscall(ctypes.c_long(435), buf, ctypes.c_size_t(len(args)))
    if pid == 0:
        time.sleep(0.5)
        os._exit(0)
    if pid < 0:
        return errno.errorcode[ctypes.get_errno()]
    cgl = open(f"/proc/{pid}/cgroup").read().strip().replace("\n", " | ")
    os.waitpid(pid, 0)
    return f"child {pid} started in: {cgl}"


# ---- reading what others type / watching the judge ---------------------------------------------
@probe("read_other_pty")
def _():
    p = T.get("pty")
    if not p:
        return "skipped"
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    time.sleep(0.3)
    try:
        return "stole: " + os.read(fd, 100).decode(errors="replace")
    except OSError as e:
        return errno.errorcode[e.errno]


@probe("inotify_on_protected_folder")
def _():
    libc.inotify_init1.restype = ctypes.c_int
    fd = libc.inotify_init1(0)
    wd = libc.inotify_add_watch(fd, T["protected_dir"].encode(), 0xFFF)
    return "watch added" if wd >= 0 else errno.errorcode[ctypes.get_errno()]


@probe("posix_lock_readonly_fd")
def _():
    import fcntl
    fd = os.open(T["victim_file"], os.O_RDONLY)
    fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return "shared lock held"


@probe("raw_block_read")
def _():
    try:
        fd = os.open("/dev/vda", os.O_RDONLY)
        n = len(os.pread(fd, 4096, 1024))
        os.close(fd)
        return f"read {n} bytes of the raw disk"
    except OSError as e:
        return errno.errorcode[e.errno]
