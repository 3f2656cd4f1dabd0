"""Session 38: what a kernel host's filter lets setpriority reach (run in a process group of its own:
`setsid python prio_filter.py`). Three processes of one group, as in a re-timing or `pipe compare`:
the parent (root with its capabilities: the worker), a 'rival' host and an 'attacker' host, both
with every capability dropped and the host's own filter on (kernel_host._drop_capabilities,
sandbox.install(own_pid)). The attacker calls setpriority(PRIO_PGRP, 0, 19): the filter's PID_ARGS
check reads `who` (0: allowed) and never `which`."""
import ctypes
import os
import sys
import time

sys.path.insert(0, "/work/main")
from runner.build.backends import kernel_host as kh  # noqa: E402
from runner.judge import sandbox  # noqa: E402


def host(role: str, w) -> None:
    libc = kh._libc()
    kh._drop_capabilities(libc)
    assert sandbox.install(own_pid=os.getpid())
    if role == "attacker":
        time.sleep(0.3)
        libc.setpriority.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_int]
        rc = libc.setpriority(1, 0, 19)  # PRIO_PGRP, who = 0: the caller's group
        os.write(w, f"attacker: setpriority(PRIO_PGRP, 0, 19) rc={rc} errno={ctypes.get_errno()}\n".encode())
    time.sleep(1.0)
    os._exit(0)


r, w = os.pipe()
kids = {}
for role in ("rival", "attacker"):
    pid = os.fork()
    if pid == 0:
        host(role, w)
    kids[role] = pid
time.sleep(0.8)
print(os.read(r, 200).decode().strip())
for role, pid in kids.items():
    print(f"{role} host (no capabilities, filtered): nice {os.getpriority(os.PRIO_PROCESS, pid)}")
print(f"worker stand-in (root, capabilities): nice {os.getpriority(os.PRIO_PROCESS, 0)}")
for pid in kids.values():
    os.waitpid(pid, 0)
