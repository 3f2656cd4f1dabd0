"""A command agent is confined (runner/search/agents/confine.py): it writes only to its own
folder, reaches no process of the judge's, connects only to the ports the spec allows, and
leaves nothing running. Real processes under the kernel's Landlock, no stand-ins: where the
kernel offers too little, the tests check that the agent is refused instead, with the reason.

The end-to-end test runs `pipe run` on the CPU pipeline with an agent that tries, on every
call, each way an agent process could reach the record or the judge, and reports what
happened in its proposals' notes (which the ledger keeps)."""

import itertools
import json
import os
import pathlib
import shutil
import socket
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

from runner.search.agents import confine

from .conftest import pipe_main
from .test_agents_external import spec_with_agent

CONFINED = confine.unavailable() is None
TRAMPOLINE = [sys.executable, "-I", "-S", confine.__file__]


def jail(tmp_path, timeout_s=20, ports=(443,)) -> tuple[list[str], dict]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    st = work.stat()
    cfg = {"writable": [{"path": str(work), "dev": st.st_dev, "ino": st.st_ino}], "workdir": str(work),
           "cwd": str(work), "ports": list(ports), "timeout_s": timeout_s}
    return [*TRAMPOLINE, json.dumps(cfg), "--"], cfg


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


LEAVE_A_DAEMON = r'''
import os, sys, time
if os.fork() == 0:
    if os.fork() == 0:
        open("daemon.pid", "w").write(str(os.getpid()))
        time.sleep(600)
    os._exit(0)
for _ in range(200):
    if os.path.exists("daemon.pid") and open("daemon.pid").read():
        break
    time.sleep(0.01)
print("answered")
'''


@pytest.mark.skipif(not CONFINED, reason="the refusal is what the other tests check here")
def test_the_trampoline_confines_writes_signals_and_ports(tmp_path):
    outside = tmp_path / "outside.txt"
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    master, slave = os.openpty()  # a terminal of the user's
    pty = os.ttyname(slave)
    unix = socket.socket(socket.AF_UNIX)  # a service behind a unix socket with a path
    unix.bind(str(tmp_path / "service.sock"))
    unix.listen(4)
    probe = f'''
import os, signal, socket, json
out = {{}}
def t(name, f):
    try:
        f(); out[name] = "ok"
    except OSError as e:
        out[name] = e.errno
t("own", lambda: open("mine.txt", "w").write("x"))
t("outside", lambda: open({str(outside)!r}, "w").write("x"))
t("devnull", lambda: open("/dev/null", "w").write("x"))
t("signal", lambda: os.kill({os.getpid()}, signal.SIGCONT))
t("memory", lambda: open("/proc/{os.getpid()}/mem", "rb").read(1))
def connect(p):
    s = socket.create_connection(("127.0.0.1", p), timeout=2); s.close()
t("port_denied", lambda: connect({port}))
t("unix", lambda: socket.socket(socket.AF_UNIX).connect({str(tmp_path / "service.sock")!r}))
t("pair", lambda: socket.socketpair())
t("mptcp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262))
t("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close())
t("bind", lambda: socket.socket().bind(("127.0.0.1", 0)))
# the trampoline (its parent, outside its domain) and the test's process: out of reach
t("kill_trampoline", lambda: os.kill(os.getppid(), signal.SIGKILL))
t("renice_other", lambda: os.setpriority(os.PRIO_PROCESS, {os.getpid()}, 19))
t("pin_other", lambda: os.sched_setaffinity({os.getpid()}, {{0}}))
import resource
t("limit_other", lambda: resource.prlimit({os.getpid()}, resource.RLIMIT_CPU, (1, 1)))
t("renice_self", lambda: os.setpriority(os.PRIO_PROCESS, 0, 1))
t("limit_self", lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))
t("device_node", lambda: os.mknod("disk", 0o600 | 0o60000, os.makedev(7, 0)))
t("chown", lambda: os.chown("mine.txt", 65534, 65534))
t("chmod", lambda: os.chmod("mine.txt", 0o600))
import ctypes, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def c_call(name, *args):
    if getattr(libc, name)(*args) == -1:
        raise OSError(ctypes.get_errno(), name)
t("shm_segment", lambda: c_call("shmget", 0, 1 << 20, 0o1600))  # IPC_PRIVATE, IPC_CREAT | 0600
t("keyring", lambda: c_call("syscall", 250, 0, -3, 0, 0))  # keyctl(KEYCTL_GET_KEYRING_ID, session)
t("namespace", lambda: c_call("unshare", 0x10000000))  # CLONE_NEWUSER
t("terminal", lambda: open({pty!r}, "rb", buffering=0).read(1))
t("subprocess", lambda: subprocess.run(["true"], check=True))
caps = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith(("CapEff", "CapPrm", "CapBnd"))]
out["caps"] = "ok" if all(int(c, 16) == 0 for c in caps[:2]) else caps
print(json.dumps(out))
'''
    argv, cfg = jail(tmp_path)
    r = subprocess.run([*argv, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["own"] == "ok" and got["devnull"] == "ok"
    assert got["outside"] == 13 and not outside.exists()  # EACCES
    assert got["signal"] == 1  # EPERM: the test's process is outside the agent's domain
    assert got["memory"] == 13
    assert got["port_denied"] == 13
    assert got["unix"] == 1 and got["pair"] == "ok"  # seccomp: no unix socket but a connected pair
    assert got["mptcp"] == 1 and got["udp"] == "ok"  # MPTCP would reach any port; UDP reaches no judge
    assert got["bind"] == 13  # no TCP server
    assert got["kill_trampoline"] == 1
    assert got["renice_other"] == got["pin_other"] == got["limit_other"] == 1
    assert got["renice_self"] == got["limit_self"] == "ok"
    assert got["device_node"] == got["chown"] == got["chmod"] == 1
    assert got["shm_segment"] == got["keyring"] == got["namespace"] == 1  # outlive it, the user's, a new kernel view
    assert got["terminal"] == 13 and got["subprocess"] == "ok"  # /dev is out of reach; clone3's fallback works
    assert got["caps"] == "ok"
    # the same port allowed by the config connects
    argv, _ = jail(tmp_path, ports=(port,))
    r = subprocess.run([*argv, sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert json.loads(r.stdout)["port_denied"] == "ok"
    srv.close()
    unix.close()
    os.close(master)
    os.close(slave)


@pytest.mark.skipif(not CONFINED, reason="the refusal is what the other tests check here")
def test_nothing_the_agent_started_outlives_its_answer_or_its_timeout(tmp_path):
    argv, cfg = jail(tmp_path)
    r = subprocess.run([*argv, sys.executable, "-c", LEAVE_A_DAEMON], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "answered", r.stderr
    pid = int((tmp_path / "work" / "daemon.pid").read_text())
    assert not alive(pid)  # a double fork does not escape the subreaper
    assert "left running were killed" in r.stderr

    (tmp_path / "work" / "daemon.pid").unlink()
    argv, cfg = jail(tmp_path, timeout_s=1.5)
    hang = LEAVE_A_DAEMON.replace('print("answered")', "time.sleep(600)")
    t0 = time.monotonic()
    r = subprocess.run([*argv, sys.executable, "-c", hang], capture_output=True, text=True, timeout=60)
    assert r.returncode == confine.KILLED_ON_TIMEOUT
    assert time.monotonic() - t0 < 20
    assert not alive(int((tmp_path / "work" / "daemon.pid").read_text()))


# CHAINS processes, each forking its successor and exiting, for HOP seconds (longer than the
# sweep's 30), then writing a heartbeat: the walk of the tree never caught up with them (session
# 66's red team: one chain lived through later trials and past the run); each chain first writes
# its process group and whether setsid and setpgid were refused. Each hop waits 2 ms: at full
# speed the chains' zombies outran their reaping and used up the machine's pids, failing the
# tests that forked beside this one
HOPPER = r'''
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <unistd.h>
static double now(void) { struct timeval t; gettimeofday(&t, 0); return t.tv_sec + t.tv_usec / 1e6; }
int main(int argc, char **argv) {
  int chains = atoi(argv[1]);
  double until = now() + atof(argv[2]);
  for (int i = 0; i < chains; i++) {
    if (fork() != 0) continue;
    int a = setsid(), ea = errno, b = setpgid(0, 0), eb = errno;
    FILE *f = fopen("chains", "a");
    fprintf(f, "%d %d %d %d %d\n", (int)getpgrp(), a, ea, b, eb);
    fclose(f);
    int fd = open("/dev/null", O_RDWR); dup2(fd, 1); dup2(fd, 2);
    while (now() < until) { pid_t p = fork(); if (p > 0) _exit(0); usleep(2000); }
    FILE *h = fopen("beat", "a"); fprintf(h, "%d\n", (int)getpid()); fclose(h);
    _exit(0);
  }
  while (1) {
    FILE *f = fopen("chains", "r"); int n = 0, c;
    if (f) { while ((c = fgetc(f)) != EOF) n += c == '\n'; fclose(f); }
    if (n >= chains) break;
    usleep(1000);
  }
  puts("answered");
  return 0;
}
'''


@pytest.mark.skipif(not CONFINED, reason="the refusal is what the other tests check here")
def test_processes_that_fork_and_exit_over_and_over_are_killed_at_once(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "hop.c").write_text(HOPPER)
    subprocess.run([cc, "-O1", "-o", str(tmp_path / "hop"), str(tmp_path / "hop.c")], check=True)
    argv, cfg = jail(tmp_path)
    t0 = time.monotonic()
    r = subprocess.run([*argv, str(tmp_path / "hop"), "8", "45"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout.strip() == "answered", r.stderr
    rows = [ln.split() for ln in (tmp_path / "work" / "chains").read_text().splitlines()]
    assert len(rows) == 8
    # no process of the agent leaves its group: setsid and setpgid are refused (EPERM)
    assert all(int(x[1]) == -1 and int(x[2]) == 1 and int(x[3]) == -1 and int(x[4]) == 1 for x in rows), rows
    group = {int(x[0]) for x in rows}
    assert len(group) == 1
    assert took < 20, took  # the walk alone ran to its 30 s deadline and gave up
    assert confine._group(group.pop()) == []
    assert "left running were killed" in r.stderr
    time.sleep(0.2)
    assert not (tmp_path / "work" / "beat").exists()


CHAIN_FROM_THREADS = r'''
import os, sys, threading, time
depth = int(sys.argv[1])
def level(n):
    with open("chain.pids", "a") as f:
        f.write(f"{os.getpid()}\n")
    if n == 0:
        time.sleep(600)
        return
    def spawn():  # the next level is this thread's child, not the main thread's
        if os.fork() == 0:
            level(n - 1)
            os._exit(0)
        time.sleep(600)
    threading.Thread(target=spawn, daemon=True).start()
    time.sleep(600)
if os.fork() == 0:
    level(depth)
    os._exit(0)
while len(open("chain.pids").read().split()) < depth + 1 if os.path.exists("chain.pids") else True:
    time.sleep(0.01)
print("answered")
'''


def test_the_sweep_sees_processes_started_from_second_threads(tmp_path):
    """The walk of the tree reads every thread's children: each level of this chain is the
    child of a second thread (before, only the main thread's were read, and the sweep found
    one level of such a chain a round)."""
    stays = CHAIN_FROM_THREADS.replace('print("answered")', 'print("answered", flush=True)\ntime.sleep(600)')
    p = subprocess.Popen([sys.executable, "-c", stays, "6"],
                         cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "answered"
        pids = [int(x) for x in (tmp_path / "chain.pids").read_text().split()]
        assert len(pids) == 7 and set(pids) <= set(confine._descendants())
    finally:
        for pid in [int(x) for x in (tmp_path / "chain.pids").read_text().split()] + [p.pid]:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        p.wait()


@pytest.mark.skipif(not CONFINED, reason="the refusal is what the other tests check here")
def test_a_chain_started_from_second_threads_is_swept_whole(tmp_path):
    """s42 red team, second pass: the sweep read the main thread's children only and gave up
    after 200 rounds; a chain of processes each started from a second thread came out one level
    a round, and the rest lived on."""
    argv, cfg = jail(tmp_path)
    depth = 40
    r = subprocess.run([*argv, sys.executable, "-c", CHAIN_FROM_THREADS, str(depth)], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "answered", r.stderr
    pids = [int(x) for x in (tmp_path / "work" / "chain.pids").read_text().split()]
    assert len(pids) == depth + 1
    assert not [p for p in pids if alive(p)]
    assert f"{depth + 1} processes the agent left running were killed" in r.stderr


@pytest.mark.skipif(not CONFINED, reason="the refusal is what the other tests check here")
def test_a_folder_swapped_for_a_link_between_calls_is_refused(tmp_path):
    """s42 red team: the agent replaced its folder by a link to the run folder in one call and
    wrote the run folder in the next."""
    argv, cfg = jail(tmp_path)
    target = tmp_path / "run"
    target.mkdir()
    work = tmp_path / "work"
    shutil.rmtree(work)
    work.symlink_to(target)
    r = subprocess.run([*argv, sys.executable, "-c", "open('x', 'w').write('x')"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == confine.CANNOT_CONFINE and "not the folder the run set up" in r.stderr
    assert not (target / "x").exists()


def test_folders_the_environment_names_for_the_judge_are_the_runners(tmp_path, monkeypatch):
    """Session 66's red team: a writable folder that PYTHONPYCACHEPREFIX named took a .pyc of the
    judge's figures module, and the judge's metric went into the ledger times 100. Every folder
    an environment variable names for the judge's processes (bytecode, headers, libraries,
    compilers, tools' caches) and the compiler's own folder are the runner's."""
    for var, sub in (("PYTHONPYCACHEPREFIX", "pyc"), ("CPLUS_INCLUDE_PATH", "inc"), ("TRITON_CACHE_DIR", "tc")):
        (tmp_path / sub / "deep").mkdir(parents=True)
        monkeypatch.setenv(var, str(tmp_path / sub) + os.pathsep + "relative/ignored")
    (tmp_path / "bin").mkdir()
    cxx = tmp_path / "bin" / "my-g++"
    cxx.write_text("#!/bin/sh\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    owned = confine.owned_paths(None, None)
    for sub, var in (("pyc", "PYTHONPYCACHEPREFIX"), ("inc", "CPLUS_INCLUDE_PATH"), ("tc", "TRITON_CACHE_DIR")):
        assert var in (confine.clash(tmp_path / sub, owned) or "")
        assert var in (confine.clash(tmp_path / sub / "deep", owned) or "")
    assert "compiles with" in (confine.clash(tmp_path / "bin", owned) or "")
    assert confine.clash(tmp_path / "elsewhere", owned) is None
    # PATH: a folder on it is the runner's, one below it is not (programs are looked up in the
    # folder itself: a PATH that holds a project folder leaves its subfolders writable)
    (tmp_path / "proj" / "scratch").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(tmp_path / "proj") + os.pathsep + os.environ["PATH"])
    owned = confine.owned_paths(None, None)
    assert "$PATH" in (confine.clash(tmp_path / "proj", owned) or "")
    assert confine.clash(tmp_path / "proj" / "scratch", owned) is None


def test_what_the_agent_may_write_is_checked_against_what_the_runner_owns(tmp_path):
    owned = confine.owned_paths(None, tmp_path / "run")
    assert "run folder" in confine.clash(tmp_path / "run" / "sub", owned)
    assert "holds" in confine.clash(tmp_path, owned)
    assert confine.clash(tmp_path / "elsewhere", owned) is None
    pkg = confine.clash(pathlib.Path(confine.__file__).resolve().parent, owned)
    assert pkg and "judge's code" in pkg
    # the temporary folder holds the judge's build folders: one inside it is fine, itself not
    tmp = pathlib.Path(confine.tempfile.gettempdir()).resolve()
    assert confine.clash(tmp, owned) and confine.clash(tmp / "mine", owned) is None
    assert "system" in confine.clash(pathlib.Path("/usr/local/include"), owned)
    assert confine.clash(pathlib.Path("/"), owned) and confine.clash(pathlib.Path.home().resolve(), owned)
    # what a careless spec could name (the red team's second pass): a repository's .git, a run
    # folder or one that holds one, a hidden folder of home, a tool's cache in the temporary folder
    (tmp_path / "repo" / ".git" / "hooks").mkdir(parents=True)
    (tmp_path / "runs" / "a-run").mkdir(parents=True)
    (tmp_path / "runs" / "a-run" / "ledger.db").write_bytes(b"")
    assert "git" in confine.unsafe(tmp_path / "repo" / ".git" / "hooks")
    assert "run folder" in confine.unsafe(tmp_path / "runs" / "a-run" / "sub")
    assert "holds" in confine.unsafe(tmp_path / "runs")
    assert "hidden" in confine.unsafe(pathlib.Path.home().resolve() / ".config" / "x")
    assert "cache" in confine.unsafe(tmp / "torchinductor_someone")
    assert confine.unsafe(tmp_path / "repo") is None and confine.unsafe(tmp / "an-agent") is None
    assert confine.nested([tmp_path / "a", tmp_path / "a" / "b"])
    assert not confine.nested([tmp_path / "a", tmp_path / "b"])


def spec_with(project, options: dict, trials: int = 2) -> str:
    """rmsnorm-cpu at FEW_ROWS with a command agent of these options."""
    return spec_with_agent(project, {"strategy": "command", "options": options}, trials)


def test_spec_errors_name_the_option_that_reaches_what_the_runner_owns(project):
    spec = spec_with(project, {"command": "true", "writable": [".", str(project / "w")],
                               "workdir": str(pathlib.Path(confine.__file__).parent), "connect_ports": [0]})
    r = pipe_main("validate", spec, cwd=project)
    assert r.returncode == 2
    err = r.stderr
    assert "agent.options.writable[0]" in err or "agent.options.writable.0" in err, err
    assert "spec's folder" in err
    assert "agent.options.workdir" in err and "judge's code" in err
    assert "agent.options.connect_ports" in err
    assert "writable[1]" not in err and "writable.1" not in err  # a folder of its own is fine
    assert all(line.startswith(spec.split("/")[-1]) or spec in line or ":" in line
               for line in err.strip().splitlines())
    assert "Traceback" not in err


ATTACKER = r'''
import json, os, signal, socket, sys, time
ctx = json.load(sys.stdin)
run_dir, spec, template, port = sys.argv[1:5]
tried = {json.dumps(t["params"], sort_keys=True) for t in ctx["history"]["recent"]}
out = {}
def t(name, f):
    try:
        f(); out[name] = "ok"
    except OSError as e:
        out[name] = e.errno
def append(p):
    with open(p, "ab") as f:
        f.write(b"x")
start = os.getcwd()  # the user's working folder: readable, not writable
os.chdir(os.environ["PIPE_AGENT_WORKDIR"])  # its own folder
t("workdir", lambda: open("note.txt", "w").write("mine"))
t("cwd_of_the_user", lambda: open(os.path.join(start, "note.txt"), "w").write("x"))
t("ledger", lambda: append(os.path.join(run_dir, "ledger.db")))
t("run_json", lambda: append(os.path.join(run_dir, "run.json")))
t("new_in_run_dir", lambda: open(os.path.join(run_dir, "forged.json"), "w").write("{}"))
t("spec", lambda: append(spec))
t("template", lambda: append(template))
import runner
t("judge_code", lambda: open(os.path.join(os.path.dirname(runner.__file__), "evil.py"), "w").write("x"))
t("cache", lambda: open(os.path.join(os.environ["PIPE_CACHE_DIR"], "evil"), "w").write("x"))
t("shm", lambda: open("/dev/shm/pipe-evil", "w").write("x"))
# the driver (the trampoline's parent) and every process it started: stop them, read their memory
me = os.getpid()
tramp = int(open(f"/proc/{me}/stat").read().split(")")[-1].split()[1])
driver = int(open(f"/proc/{tramp}/stat").read().split(")")[-1].split()[1])
t("stop_driver", lambda: os.kill(driver, signal.SIGSTOP))
t("driver_memory", lambda: open(f"/proc/{driver}/mem", "rb").read(1))
kids = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if int(open(f"/proc/{p}/stat").read().split(")")[-1].split()[1]) == driver and int(p) != tramp:
                kids.append(int(p))
        except OSError:
            pass
out["workers"] = len(kids)
for k in kids:
    t(f"stop_worker", lambda: os.kill(k, signal.SIGSTOP))
t("tcp", lambda: socket.create_connection(("127.0.0.1", int(port)), timeout=2).close())
t("unix_socket", lambda: socket.socket(socket.AF_UNIX))
t("setsid", os.setsid)  # a session of its own: out of the group the runner ends in one kill
t("setpgid", lambda: os.setpgid(0, 0))
if os.fork() == 0:  # a process left behind, to work while candidates are timed
    if os.fork() == 0:
        with open("daemon.pids", "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(600)
    os._exit(0)
time.sleep(0.2)
space = ctx["task"]["space"]["params"]
import itertools
for combo in itertools.product(*space.values()):
    p = dict(zip(space, combo))
    if json.dumps(p, sort_keys=True) not in tried:
        print(json.dumps({"proposals": [{"params": p, "note": json.dumps(out)}]}))
        break
'''


def test_a_command_agent_reaches_nothing_the_runner_owns(project):
    script = project / "attacker.py"
    script.write_text(ATTACKER)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    run_dir = project / "run"
    work = project / "agent"
    tpath = (project / "kernel_templates" / "rmsnorm.cpp.j2").resolve()
    spec = spec_with(project, {"command": [sys.executable, str(script), str(run_dir), "SPEC", str(tpath), str(port)],
                               "workdir": str(work), "timeout_s": 60}, trials=3)
    d = yaml.safe_load(open(spec))
    d["agent"]["options"]["command"][3] = spec
    open(spec, "w").write(yaml.safe_dump(d, sort_keys=False))
    before = {p: open(p, "rb").read() for p in (spec, tpath)}
    r = pipe_main("run", spec, "--run-dir", str(run_dir), cwd=project)
    srv.close()
    if not CONFINED:  # refused, with the reason and the way out
        assert r.returncode != 0 and "confine: false" in r.stderr and confine.unavailable() in r.stderr
        assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
        return
    assert r.returncode == 1, r.stderr
    db = sqlite3.connect(run_dir / "ledger.db")
    notes = [json.loads(json.loads(d).get("note") or "{}") for (d,) in db.execute("SELECT details FROM trials")]
    asked = [n for n in notes if n]
    assert len(asked) == 2, notes  # the first trial is the spec's start, the other two the agent's
    for n in asked:
        assert n.pop("workdir") == "ok" and n.pop("workers") >= 1
        assert n and all(v in (1, 13) for v in n.values()), n  # EPERM or EACCES, every one
    assert (work / "note.txt").read_text() == "mine" and not (project / "note.txt").exists()
    assert not (run_dir / "forged.json").exists() and not os.path.exists("/dev/shm/pipe-evil")
    assert {p: open(p, "rb").read() for p in (spec, tpath)} == before
    for pid in (work / "daemon.pids").read_text().split():
        assert not alive(int(pid))
    show = pipe_main("show", str(run_dir), cwd=project)
    assert show.returncode == 0 and "ledger chain: intact" in show.stdout
    assert "agent: confined (Landlock ABI" in show.stdout and str(work) in show.stdout


def test_an_agent_run_unconfined_on_purpose_is_recorded_so(project):
    script = project / "agent.py"
    script.write_text('import json, sys\nctx = json.load(sys.stdin)\n'
                      'print(json.dumps({"proposals": [{"params": {"ACC": 8, "THREADS": 1, "UNROLL": 1}}]}))\n')
    spec = spec_with(project, {"command": [sys.executable, str(script)], "confine": False}, trials=1)
    r = pipe_main("run", spec, "--run-dir", str(project / "run"), cwd=project)
    assert r.returncode == 1, r.stderr
    show = pipe_main("show", str(project / "run"), cwd=project)
    assert "agent: UNCONFINED" in show.stdout
    r = pipe_main("report", str(project / "run"), cwd=project)  # and the report says so too
    assert r.returncode == 0, r.stderr
    assert "Agent: UNCONFINED" in (project / "run" / "report.md").read_text()
    assert "Agent: UNCONFINED" in (project / "run" / "report.html").read_text()


def test_a_writable_folder_that_holds_the_run_folder_is_refused_at_the_start(project):
    w = project / "w"
    w.mkdir()
    spec = spec_with(project, {"command": "true", "writable": [str(w)]}, trials=1)
    r = pipe_main("run", spec, "--run-dir", str(w / "run"), cwd=project)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    why = "run folder" if CONFINED else "confine: false"
    assert why in r.stderr and "agent.options" in r.stderr, r.stderr


WATCHER = r'''
import json, os, sys, time, itertools
ctx = json.load(sys.stdin)
def parent(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
driver = parent(os.getppid())  # the trampoline's parent: this run's driver
def ours(pid):  # a process of this run's (another run may be timing beside it)
    for _ in range(6):
        pid = parent(pid)
        if pid == driver:
            return True
        if pid <= 1:
            return False
    return False
seen = 0
t_end = time.time() + 0.3
while time.time() < t_end:  # a judge worker's kernel hosts live for its request only
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if b"kernel_host" in open(f"/proc/{p}/cmdline", "rb").read() and ours(int(p)):
                    seen += 1
            except (OSError, ValueError, IndexError):
                pass
    time.sleep(0.02)
with open(os.path.join(os.environ["PIPE_AGENT_WORKDIR"], "calls"), "a") as f:
    f.write(f"{seen} {ctx['want']}\n")
tried = {json.dumps(t["params"], sort_keys=True) for t in ctx["history"]["recent"]}
space = ctx["task"]["space"]["params"]
out = []
for combo in itertools.product(*space.values()):
    p = dict(zip(space, combo))
    if json.dumps(p, sort_keys=True) not in tried:
        out.append({"params": p})
    if len(out) == ctx["want"] + 2:
        break
print(json.dumps({"proposals": out}))
'''


def test_a_command_agent_runs_while_no_judge_worker_times(project):
    """Scaled out, the agent was asked while other slots timed candidates, and could see the
    judge's processes and time its own load to a rival's rounds (session 42's third red team).
    Now it is asked only while every slot is idle, for every slot at once."""
    script = project / "watcher.py"
    script.write_text(WATCHER)
    work = project / "agent"
    spec = spec_with(project, {"command": [sys.executable, str(script)], "workdir": str(work), "timeout_s": 60,
                               **({} if CONFINED else {"confine": False})}, trials=7)
    r = pipe_main("run", spec, "--run-dir", str(project / "run"), "--workers", "2", cwd=project)
    assert r.returncode == 1, r.stderr
    calls = [tuple(map(int, ln.split())) for ln in (work / "calls").read_text().splitlines()]
    assert calls and all(seen == 0 for seen, _ in calls), calls
    assert any(want >= 2 for _, want in calls)  # asked for both slots at once
    db = sqlite3.connect(project / "run" / "ledger.db")
    rows = db.execute("SELECT started_at, finished_at FROM trials ORDER BY id").fetchall()
    assert len(rows) == 7
    # and the slots still judged side by side: some two trials overlap in time
    assert any(a[0] < b[1] and b[0] < a[1] for a, b in itertools.combinations(rows, 2))
