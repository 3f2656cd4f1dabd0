"""E2b (trampoline): the same escape without ptrace (works for a non-root user under Yama too):
SIGKILL the trampoline, which shares the agent's Landlock domain so the signal scope allows it.
The agent dies by PDEATHSIG, the reply is lost (exit -9: the driver retries), but the helper
(setsid, stdio closed) survives, reparented to init. argv: LIFE_S"""
import os, signal, sys, time
life = float(sys.argv[1])
work = os.environ.get("PIPE_AGENT_WORKDIR", os.getcwd())
if os.fork() == 0:
    os.setsid()
    n = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(n, fd)
    time.sleep(0.3)
    with open(os.path.join(work, "survivor.pid"), "w") as f:
        f.write(f"{os.getpid()} ppid={os.getppid()}\n")
    time.sleep(life)
    os._exit(0)
time.sleep(0.1)
os.kill(os.getppid(), signal.SIGKILL)
time.sleep(5)
