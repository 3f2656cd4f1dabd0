"""Red team 65 (session helper): the kernel host's hold, the census and what a loaded host can read."""
from __future__ import annotations

import ctypes, os, signal, subprocess, threading, time
import pytest, torch
from runner.build.backends import cpu_host as host
from runner.build.backends import kernel_host as kh

LIB = r"""
#include <cstdint>
#include <cerrno>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <linux/futex.h>
#include <csignal>
#include <thread>
#include <atomic>
#include <pthread.h>
#include <cstring>

static int census_fd() {
  struct stat st;
  for (int fd = 3; fd < 1024; ++fd)
    if (syscall(SYS_fstat, fd, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR) return fd;
  return -1;
}
static long nthreads() {  // threads of this process (link count - 2)
  struct stat st;
  static int fd = -1;
  if (fd < 0) fd = census_fd();
  if (syscall(SYS_fstat, fd, &st) != 0) return -1;
  return (long)st.st_nlink - 2;
}
static void* exit_with_tid_at(void* a) {  // this thread's exit: 0 written at `a` and one SHARED futex wake there
  syscall(SYS_set_tid_address, a);
  syscall(SYS_exit, 0);
  return nullptr;
}
static std::atomic<int> go_on{0};
static std::atomic<long> spins{0};
static void* worker(void*) {  // works while the host is held/continued: counts spins
  while (go_on.load() == 0) sched_yield();
  for (long i = 0; i < 20000000; ++i) spins.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}
static void* dier(void*) { return nullptr; }

extern "C" void k(int64_t mode, float* x, int64_t n, uint32_t* ctl, int64_t* out) {
  if (mode == 0) { for (int64_t i = 0; i < 16; ++i) x[i] += 1.0f; return; }
  if (mode == 40) {  // the census folder's times
    struct stat st;
    int fd = census_fd();
    out[6] = fd;
    out[7] = syscall(SYS_fstat, fd, &st) == 0 ? 0 : errno;
    out[0] = st.st_atim.tv_sec; out[1] = st.st_atim.tv_nsec;
    out[2] = st.st_mtim.tv_sec; out[3] = st.st_mtim.tv_nsec;
    out[4] = st.st_ctim.tv_sec; out[5] = st.st_ctim.tv_nsec;
    out[8] = st.st_ino; out[9] = st.st_nlink;
    return;
  }
  if (mode == 41) {  // a shared futex wake (and a 0 written) at address n, through a thread's exit
    pthread_t t;
    pthread_attr_t at; pthread_attr_init(&at); pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    out[0] = pthread_create(&t, &at, exit_with_tid_at, (void*)n);
    while (nthreads() > 1) sched_yield();   // gone: not counted by the census
    out[1] = nthreads();
    return;
  }
  if (mode == 44 || mode == 45) {  // 44: done, stop self (the judge lists nothing, sets `held`), then a thread
    // alive at the census that cancels the census's SIGSTOP with SIGCONTs, works, and ends; 45: the same
    // without the early stop (the control)
    ctl[1] = ctl[0];
    if (mode == 44) syscall(SYS_tgkill, getpid(), getpid(), SIGSTOP);
    spins.store(0);
    pthread_t t;
    pthread_attr_t at; pthread_attr_init(&at); pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_create(&t, &at, [](void* a) -> void* {
      const int64_t n = (int64_t)a;
      const pid_t p = getpid();
      for (int64_t i = 0; i < n; ++i) syscall(SYS_tgkill, p, p, SIGCONT);
      spins.fetch_add(1);
      return nullptr;
    }, (void*)n);
    return;
  }
  if (mode == 42) {  // the process stopped by the kernel itself, before `done`
    syscall(SYS_tgkill, getpid(), getpid(), SIGSTOP);
    return;
  }
  if (mode == 43) {  // the process stopped by the kernel itself after writing `done` (its own early done)
    ctl[1] = ctl[0];
    syscall(SYS_tgkill, getpid(), getpid(), SIGSTOP);
    return;
  }
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("rt65")
    src, so = d / "k.cpp", d / "k.so"
    src.write_text(LIB)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-pthread", str(src), "-o", str(so)], check=True)
    return str(so)


KINDS = ["i64", "ptr", "i64", "ptr", "ptr"]


@pytest.fixture()
def rig(lib):
    arena, census = host.Arena(1 << 26), host.HostCensus()
    h = host.Host(arena, lib, "k", KINDS, census)
    census.hosts, census.arena = [h], arena
    x = arena.tensor(torch.zeros(4096))
    out = arena.tensor(torch.zeros(16, dtype=torch.int64))
    ctl = arena.base + h.ctl_off

    def call(mode, n=0):
        return host.HostCall(h, [mode, x.data_ptr(), n, ctl, out.data_ptr()])

    yield h, census, x, out, call
    h.close()


def test_census_folder_times(rig):
    h, census, x, out, call = rig
    rows = []
    for i in range(3):
        call(40)()
        rows.append([int(v) for v in out[:10]])
        census.check(); print("census:", census.take())
        time.sleep(1.2)
    print("now", time.time(), "host start?")
    for r in rows:
        print(r)


def _rival(h, lib):
    census = h.census
    h2 = host.Host(h.arena, lib, "k", KINDS, census)
    census.hosts = [h, h2]
    return h2


@pytest.mark.parametrize("word", ["SEQ", "GO"])
def test_thread_exit_wakes_a_rival(lib, rig, word):
    """A thread's exit writes 0 at its clear_child_tid address and makes a SHARED futex wake there
    (the kernel's own, never seen by seccomp): pointed at a rival host's command word."""
    h, census, x, out, call = rig
    h2 = _rival(h, lib)
    try:
        y = h.arena.tensor(torch.zeros(4096))
        o2 = h.arena.tensor(torch.zeros(16, dtype=torch.int64))
        honest = host.HostCall(h2, [0, y.data_ptr(), 0, h.arena.base + h2.ctl_off, o2.data_ptr()])
        honest(); honest.timed()
        census.check(); print("before:", census.take())
        target = h.host_base + h2.ctl_off + getattr(kh, word)
        if word == "GO":
            honest.scrub(1 << 20)  # primed: the rival asleep on `go`
        c = call(41, target)
        t0 = time.perf_counter()
        c()
        print("attacker's call:", [int(v) for v in out[:2]], "rival seq word", h2.u32[kh.SEQ // 4], "judge's", h2.seq)
        census.check(); print("after attacker's call:", census.take())
        time.sleep(0.05)
        print("rival state", h2._state(), "where", h2._where(), "loop_where", h2.loop_where, "cpu since", h2._cpu() - h2.cpu_after)
        try:
            t = honest.timed()
            print("rival timed", t)
        except host.HostDied as e:
            print("rival HostDied:", e, "after", time.perf_counter() - t0)
        census.check(); print("rival's census:", census.take())
    finally:
        h2.close()


@pytest.mark.parametrize("mode", [42, 43])
def test_kernel_stops_itself(rig, mode):
    h, census, x, out, call = rig
    res = {}

    def drive():
        try:
            res["t"] = call(mode).timed()
        except Exception as e:  # noqa
            res["e"] = repr(e)
    th = threading.Thread(target=drive, daemon=True)
    t0 = time.perf_counter()
    th.start()
    th.join(15)
    print("mode", mode, "alive(judge stuck)?", th.is_alive(), "state", h._state(), res, "after", time.perf_counter() - t0)
    if th.is_alive():
        os.kill(h.pid, signal.SIGCONT)
        th.join(5)
        print("after our SIGCONT:", th.is_alive(), res)
    census.check(); print("census:", census.take())


@pytest.mark.parametrize("mode", [44, 45])
def test_census_stop_cancelled(rig, mode):
    h, census, x, out, call = rig
    from collections import Counter
    seen = Counter()
    for i in range(60):
        time.sleep(0.02)
        census.check(); census.take(); census.convicted.clear()
        h.blipped = False
        call(mode, 300)()
        census.check("the call")
        why = census.take()
        seen[(why or "none")[:70]] += 1
        census.convicted.clear()
    print("mode", mode, dict(seen))


@pytest.mark.parametrize("mode", [44, 45])
def test_census_stop_cancelled_one_core(lib, mode):
    arena, census = host.Arena(1 << 24), host.HostCensus()
    h = host.Host(arena, lib, "k", KINDS, census, threads=1)
    census.hosts, census.arena = [h], arena
    x = arena.tensor(torch.zeros(64)); out = arena.tensor(torch.zeros(16, dtype=torch.int64))
    ctl = arena.base + h.ctl_off
    from collections import Counter
    seen = Counter()
    try:
        print("host cpus", h._cpus, "judge on", os.sched_getaffinity(0))
        import socket as _s
        real = h._reported
        peek = {}

        def spy():
            try:
                b = h._report.recv(64, _s.MSG_PEEK)
                peek["rec"] = kh.REPORT.unpack(b) if len(b) == 8 else b
            except BlockingIOError:
                peek["rec"] = None
            peek["held"] = h.held
            real()
        h._reported = spy
        for i in range(int(os.environ.get('RT65_N', '100'))):
            time.sleep(0.01)
            census.check(); census.take(); census.convicted.clear()
            h.blipped = False
            c = host.HostCall(h, [mode, x.data_ptr(), 300, ctl, out.data_ptr()])
            t = c.timed()
            census.check("the call")
            why = census.take()
            seen[(why or "none")[:60] + (f" n={peek['rec'][1]} held={peek['held']}" if not why else "")] += 1
            census.convicted.clear()
        print("mode", mode, dict(seen))
    finally:
        h.close()
