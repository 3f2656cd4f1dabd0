"""A command agent that leaves processes alive after the trampoline's sweep (runs CONFINED).

The sweep (confine.sweep) finds descendants through /proc/PID/task/PID/children: the children of
each process's MAIN thread only, and gives up after 200 rounds. Each process of this chain forks
its successor from a second thread (which then stays alive, so the child is never reparented to
the main thread): each level is invisible until the level above it dies. One sweep round kills
the visible level; the next level is reparented to the trampoline and is seen in the next round.
A chain deeper than 200 levels outlasts the sweep, with no race to win.

argv: [run_dir spec template] DEPTH BURN_S (the harness passes the first three; the trampoline-only
check passes just DEPTH BURN_S). A survivor (ppid no longer under the trampoline) takes a lock in
the workdir; the one that gets it writes heartbeats (helper.log) and burns one CPU for BURN_S s."""
import fcntl, json, os, sys, threading, time

args = sys.argv[1:]
if len(args) >= 5:
    args = args[3:]
DEPTH, BURN_S = int(args[0]), float(args[1])
WORK = os.environ.get("PIPE_AGENT_WORKDIR") or os.getcwd()
LOG = os.path.join(WORK, "helper.log")
TRAMP = os.getppid()


def log(msg):
    with open(LOG, "a") as f:
        f.write(f"{time.time():.3f} pid={os.getpid()} ppid={os.getppid()} {msg}\n")


def answer():
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)) + "/../s42-jail")
        import agentlib
        ctx = agentlib.context()
        return agentlib.answer(ctx, {"agent": "deepchain", "depth": DEPTH})
    except Exception:
        return json.dumps({"proposals": []})


def survivor(level):
    """Waits until the trampoline is gone, then (one of the survivors) burns a CPU."""
    t_end = time.time() + 60
    while time.time() < t_end:
        try:
            os.kill(TRAMP, 0)  # ESRCH once the trampoline has exited (EPERM while it runs: another domain)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(0.05)
    else:
        os._exit(0)
    fd = os.open(os.path.join(WORK, "burner.lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log(f"level {level} survived (not the burner)")
        os._exit(0)
    log(f"level {level} survived the sweep; burning for {BURN_S} s")
    t0 = last = time.time()
    x = 0
    while time.time() - t0 < BURN_S:
        x += 1
        if time.time() - last > 1:
            last = time.time()
            log(f"burning, {x} iterations")
    log("done")
    os._exit(0)


def level(n):
    """This process is level n: fork level n-1 from a second thread, keep that thread alive."""
    if n == 0:
        open(os.path.join(WORK, "ready"), "w").close()
        survivor(0)

    def spawn():
        pid = os.fork()
        if pid == 0:
            level(n - 1)  # in the child: only this thread exists; it becomes the main one of the child
            os._exit(0)
        while True:
            time.sleep(3600)  # this thread stays, so the child is never the main thread's

    threading.Thread(target=spawn, daemon=True).start()
    if n != DEPTH:
        survivor(n)


if __name__ == "__main__":
    out = answer()
    sys.stdout.write(out)
    sys.stdout.flush()
    for p in ("ready", "burner.lock"):
        try:
            os.unlink(os.path.join(WORK, p))
        except OSError:
            pass
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # the driver waits for EOF on the pipes: survivors must not hold them
    import warnings
    warnings.simplefilter("ignore")  # fork from a thread
    log(f"agent (trampoline {TRAMP}) builds a chain of {DEPTH}")
    level(DEPTH)
    t0 = time.time()
    while not os.path.exists(os.path.join(WORK, "ready")) and time.time() - t0 < 40:
        time.sleep(0.02)
    log(f"chain ready in {time.time() - t0:.2f} s; the agent exits")
    os._exit(0)
