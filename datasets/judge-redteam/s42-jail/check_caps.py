"""Reproducer for the trampoline-level probes (probe_caps.py), against victims this script owns.

    cd /work/main && . .venv/bin/activate
    python datasets/judge-redteam/s42-jail/check_caps.py

Sets up under /tmp/s42-jail/caps: a victim process (a sleeping python, standing in for the driver /
the judge's worker), a victim file (standing in for ledger.db), a pathname unix socket server, a
UDP server, a TCP server on a port the jail does NOT allow, an abstract unix socket server and a
loop device on a 4 MiB scratch image. Runs probe_caps.py under the real trampoline
(python -I -S runner/search/agents/confine.py CONFIG -- python probe_caps.py ...), then prints
what the agent reported and what the victims show from the outside. Reverts the victim file's
immutable flag and detaches the loop device."""
import json, os, shutil, socket, subprocess, sys, threading, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CONFINE = ROOT / "runner" / "search" / "agents" / "confine.py"
base = Path("/tmp/s42-jail/caps")
subprocess.run(["chattr", "-i", str(base / "victim.txt")], capture_output=True)
shutil.rmtree(base, ignore_errors=True)
(base / "work").mkdir(parents=True)
vfile = base / "victim.txt"
vfile.write_text("ledger stand-in\n")
os.chmod(vfile, 0o644)
victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

got = {"unix": [], "udp": [], "tcp": [], "abstract": []}
usock = str(base / "svc.sock")
us = socket.socket(socket.AF_UNIX); us.bind(usock); us.listen(4)
ud = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); ud.bind(("127.0.0.1", 0))
ts = socket.socket(); ts.bind(("127.0.0.1", 0)); ts.listen(8)
ab = socket.socket(socket.AF_UNIX); ab.bind("\0s42-abstract"); ab.listen(4)


def serve(sock, key, stream=True):
    sock.settimeout(30)
    try:
        while True:
            if stream:
                c, _ = sock.accept()
                c.settimeout(2)
                try:
                    got[key].append(c.recv(100).decode(errors="replace") or "(connected)")
                except OSError:
                    got[key].append("(connected)")
                c.close()
            else:
                got[key].append(sock.recv(100).decode())
    except OSError:
        pass


for s, k, st in ((us, "unix", True), (ud, "udp", False), (ts, "tcp", True), (ab, "abstract", True)):
    threading.Thread(target=serve, args=(s, k, st), daemon=True).start()

img = base / "disk.img"
with open(img, "wb") as f:
    f.truncate(4 << 20)
loop = subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True, text=True).stdout.strip()

def folder(p):  # the trampoline's entry for a writable folder: its path and identity
    import os as _os
    _os.makedirs(p, exist_ok=True)
    st = _os.stat(p)
    return {"path": str(p), "dev": st.st_dev, "ino": st.st_ino}

cfg = {"writable": [folder(base / "work")], "workdir": str(base / "work"), "ports": [443, 80], "timeout_s": 60,
       "abi": None}
env = dict(os.environ, S42_LOOP=loop, PIPE_AGENT_WORKDIR=str(base / "work"))
r = subprocess.run([sys.executable, "-I", "-S", str(CONFINE), json.dumps(cfg), "--", sys.executable,
                    str(HERE / "probe_caps.py"), str(victim.pid), str(vfile), usock, str(ud.getsockname()[1]),
                    str(ts.getsockname()[1]), "s42-abstract"], capture_output=True, text=True, timeout=120, env=env)
time.sleep(0.5)
print("trampoline rc", r.returncode, r.stderr.strip()[-500:])
print(r.stdout)
print("== from outside ==")
st = os.stat(vfile)
print("victim file: mode", oct(st.st_mode & 0o777), "uid", st.st_uid, "mtime", st.st_mtime,
      "lsattr", subprocess.run(["lsattr", str(vfile)], capture_output=True, text=True).stdout.strip(),
      "xattrs", os.listxattr(vfile))
print("victim process: nice", os.getpriority(os.PRIO_PROCESS, victim.pid), "affinity", os.sched_getaffinity(victim.pid),
      "policy", os.sched_getscheduler(victim.pid), "(5=SCHED_IDLE)",
      "nofile", open(f"/proc/{victim.pid}/limits").read().split("Max open files")[1].split()[:2])
print("servers received:", json.dumps(got))
if loop:
    data = img.read_bytes()
    i = data.find(b"S42-RAW-BLOCK-WRITE")
    print("scratch image written through the agent's own block node:", i >= 0, "at", i)
    subprocess.run(["losetup", "-d", loop])
print("kmsg:", subprocess.run("dmesg 2>/dev/null | grep s42-jail | tail -1", shell=True, capture_output=True,
                              text=True).stdout.strip())
subprocess.run(["chattr", "-i", str(vfile)])
victim.kill()
