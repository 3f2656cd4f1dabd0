"""Agent-side, more probes (run inside the trampoline; check_more.sh): io_uring, user+mount
namespaces without a uid map, SCHED_FIFO for itself, /dev/mem read, a BPF program load."""
import ctypes, errno, os, subprocess, struct
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
out = {}
def sc(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *a)
    if r < 0:
        raise OSError(ctypes.get_errno(), "")
    return r
def t(n, f):
    try: out[n] = "ok " + str(f())
    except OSError as e: out[n] = errno.errorcode.get(e.errno, str(e.errno))
params = (ctypes.c_uint8 * 120)()
t("io_uring_setup", lambda: sc(425, ctypes.c_uint(4), ctypes.byref(params)))
r = subprocess.run(["unshare", "-U", "-m", "sh", "-c", "id -u; mount -t tmpfs x /tmp 2>&1; mount --bind /tmp /mnt 2>&1; echo rc=$?"], capture_output=True, text=True)
out["unshare_U_m_mount"] = (r.stdout + r.stderr).strip().replace("\n", " | ")
r = subprocess.run(["unshare", "-U", "-m", "-p", "-f", "--mount-proc", "true"], capture_output=True, text=True)
out["unshare_pid_mountproc"] = (r.stdout + r.stderr).strip().replace("\n", " | ")[:200]
def fifo():
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)); p = os.sched_getscheduler(0)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0)); return f"policy {p} (1=FIFO), reverted"
t("sched_fifo_self", fifo)
t("dev_mem_read", lambda: len(open("/dev/mem", "rb").read(16)))
def bpf_prog():
    insns = struct.pack("<BBhi", 0xb7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)  # r0 = 0; exit
    buf = ctypes.create_string_buffer(insns)
    lic = ctypes.create_string_buffer(b"GPL")
    attr = (ctypes.c_uint8 * 128)()
    struct.pack_into("<IIQQ", attr, 0, 1, 2, ctypes.addressof(buf), ctypes.addressof(lic))  # SOCKET_FILTER
    fd = sc(321, ctypes.c_int(5), ctypes.byref(attr), ctypes.c_uint(128)); os.close(fd); return "loaded"
t("bpf_prog_load", bpf_prog)
import json; print(json.dumps(out, indent=1))
