"""E2 (pipe run): a process of the agent's outlives its answer, so that it runs while the judge
times the candidates. The agent and its trampoline share one Landlock domain, so the agent may
ptrace the trampoline (root here; same-uid with Yama off): a helper attaches to it, stops it at
its next system call and turns that call into exit_group(0). The trampoline exits 0 without its
sweep, the driver takes the reply the agent had already written, and the helper (setsid, its
stdio on /dev/null, reparented to init) lives on: here it pins itself to the judge's CPU(s) and
burns them for BURN_S seconds, logging heartbeats to the agent's workdir, then exits.
argv: run_dir spec template BURN_S"""
import ctypes, json, os, signal, sys, time
from agentlib import answer, context, tree

ctx = context()
burn_s = float(sys.argv[4])
work = os.environ.get("PIPE_AGENT_WORKDIR", ".")
tramp, driver, workers = tree()
calls = len(ctx["history"]["recent"])
note = {"tramp": tramp, "driver": driver, "workers": workers, "call": calls}
if calls != 1:  # only the first call leaves a helper; the later ones just answer
    print(answer(ctx, note))
    sys.exit(0)

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SYSCALL = 12, 13, 16, 17, 24
Regs = ctypes.c_ulong * 27  # x86-64 user_regs_struct: rax 10, rdi 14, orig_rax 15
r_ready, w_ready = os.pipe()

if os.fork() == 0:  # the helper
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(r_ready)
    log = open(os.path.join(work, "helper.log"), "a", buffering=1)
    log.write(f"{time.time():.3f} helper {os.getpid()} attaching to trampoline {tramp}\n")
    ok = False
    if libc.ptrace(PTRACE_ATTACH, tramp, None, None) == 0:
        os.waitpid(tramp, 0x40000000)  # __WALL
        regs = Regs()
        for _ in range(50):
            libc.ptrace(PTRACE_SYSCALL, tramp, None, None)
            os.waitpid(tramp, 0x40000000)
            libc.ptrace(PTRACE_GETREGS, tramp, None, ctypes.byref(regs))
            if ctypes.c_long(regs[10]).value == -38:  # a syscall entry stop (rax = -ENOSYS)
                regs[15], regs[14] = 231, 0  # exit_group(0)
                libc.ptrace(PTRACE_SETREGS, tramp, None, ctypes.byref(regs))
                libc.ptrace(PTRACE_DETACH, tramp, None, None)
                ok = True
                break
    log.write(f"{time.time():.3f} hijack {'done' if ok else 'FAILED errno %d' % ctypes.get_errno()}\n")
    os.write(w_ready, b"x")
    cpus = set()
    for w in workers:
        try:
            cpus |= os.sched_getaffinity(w)
        except OSError:
            pass
    t_end = time.time() + burn_s
    nxt = 0
    while time.time() < t_end:  # burn, and say so every 0.5 s
        if time.time() > nxt:
            log.write(f"{time.time():.3f} alive ppid={os.getppid()} burning cpus={sorted(cpus)}\n")
            nxt = time.time() + 0.5
        sum(i * i for i in range(20000))
    log.write(f"{time.time():.3f} helper exits\n")
    os._exit(0)

os.close(w_ready)
note["helper"] = "started"
sys.stdout.write(answer(ctx, note))
sys.stdout.flush()
os.close(1)
os.read(r_ready, 1)  # the trampoline is gone by now; PDEATHSIG ends this process
time.sleep(30)
