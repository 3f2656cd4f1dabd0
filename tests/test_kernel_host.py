"""The CPU kernel host (build/backends/cpu_host.py, build/backends/kernel_host.py): a candidate's library in a process
of its own. Each library here is built straight by g++, past every static rule, as the worst
case of a candidate that got through them: what is left is the process boundary, the filter
and the judge's own clock."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import subprocess
import time
from pathlib import Path

import pytest
import torch

from runner.build.backends import cpu_host as host
from runner.build.backends import kernel_host as kh

pytestmark = pytest.mark.skipif(not host.supported(), reason="the kernel host is x86-64 Linux")

LIB = r"""
#include <cstdint>
#include <cerrno>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <chrono>
#include <ctime>
#include <csignal>
#include <sys/time.h>
#include <immintrin.h>
#include <thread>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/sysinfo.h>
#include <sys/resource.h>
#include <cstring>
#include <cstdio>
#include <sched.h>

static void work(int64_t n, float* x) {  // CPU work, not wall time: the same under preemption
  volatile float a = x[0];
  for (int64_t i = 0; i < n; ++i) a = a * 0.999f + 1.0f;
  x[1] = a;
}

// about 8 ms of CPU work (the host's allow list refuses every clock, so no spin on the time):
// tests compare what the judge charges with this work's own CPU time, taken in their process
static const int64_t WORK = 2000000;

static void busy(int64_t units) {
  float s[2] = {1.0f, 0.0f};
  work(units, s);
}

// the first descriptor of a kind (S_IFSOCK: the host's census socket; S_IFDIR: its task directory):
// a loaded host lists only the directory (getdents64) and stats nothing, so the socket is the other
// open descriptor past 2
static int first_fd(unsigned kind) {
  static char dents[1 << 12];
  for (int fd = 3; fd < 1024; ++fd) {
    if (fcntl(fd, F_GETFD) == -1) continue;
    const bool dir = syscall(SYS_getdents64, fd, dents, sizeof dents) >= 0;
    if (dir) lseek(fd, 0, SEEK_SET);
    if (dir == (kind == S_IFDIR)) return fd;
  }
  return -1;
}

// a thread alive when the call returns, which ends moments after (a couple of thousand yields past
// `done`, about a millisecond): before the judge, which looks only once the host sleeps, can list it
static void outlive_the_call(const uint32_t* ctl) {
  std::thread([ctl] {
    const uint32_t s = __atomic_load_n(&ctl[0], __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&ctl[1], __ATOMIC_SEQ_CST) != s) sched_yield();
    for (int i = 0; i < 2000; ++i) sched_yield();
  }).detach();
}

// a census record of its own for this command (its sequence number, no threads), as the host writes them
static int64_t forge(const uint32_t* ctl) {
  const uint32_t rec[2] = {ctl[0], 0};
  return write(first_fd(S_IFSOCK), rec, sizeof rec);
}

// mode 0: honest (adds 1 to x); 1: writes the host's `done` itself, then works 8 ms;
// 2: writes `done`, sleeps on the command word until the next command, then works 8 ms;
// 3: the syscalls that name the worker, each result in out[0..3]; 4: 8 ms of work;
// 5: writes `done`, sleeps, then works (while the judge calls another host); 6: a write outside x;
// 9: reads and marks the stack n bytes below its frame
extern "C" void k(int64_t mode, float* x, int64_t n, uint32_t* ctl, int64_t* out) {
  if (mode == 0) { for (int64_t i = 0; i < n; ++i) x[i] += 1.0f; return; }
  if (mode == 1) { ctl[1] = ctl[0]; busy(WORK); return; }
  if (mode == 2) {
    uint32_t s = ctl[0];
    ctl[1] = s;
    while (__atomic_load_n(&ctl[0], __ATOMIC_SEQ_CST) == s) syscall(SYS_futex, &ctl[0], FUTEX_WAIT, s, nullptr, nullptr, 0);
    busy(WORK);
    return;
  }
  if (mode == 3) {
    pid_t w = getppid();
    out[0] = syscall(SYS_tgkill, w, w, 0) == -1 ? errno : 0;
    out[1] = syscall(SYS_setpriority, 0, w, 19) == -1 ? errno : 0;
    char path[64];
    int len = 0;
    const char* a = "/proc/";
    for (; a[len]; ++len) path[len] = a[len];
    char digits[16]; int d = 0; for (pid_t v = w; v; v /= 10) digits[d++] = '0' + v % 10;
    while (d) path[len++] = digits[--d];
    const char* b = "/mem";
    for (int i = 0; b[i]; ++i) path[len++] = b[i];
    path[len] = 0;
    int fd = open(path, O_RDONLY);
    out[2] = fd < 0 ? errno : 0;
    out[3] = syscall(SYS_tgkill, getpid(), getpid(), 0) == -1 ? errno : 0;  // itself: allowed
    return;
  }
  if (mode == 5) {  // writes `done`, sleeps 20 ms (the judge sees it asleep), then works about 8 ms
    ctl[1] = ctl[0];
    struct timespec ts = {0, 20000000};
    syscall(SYS_nanosleep, &ts, nullptr);
    busy(WORK);
    return;
  }
  if (mode == 6) { x[(32 << 20) / 4] = 1.0f; return; }  // 32 MiB past x: the arena's free space
  if (mode == 7) {  // a signal handler and a CPU-time timer: code that would run outside a call
    struct sigaction sa = {};
    sa.sa_handler = SIG_IGN;
    out[0] = sigaction(SIGPROF, &sa, nullptr) == -1 ? errno : 0;
    struct itimerval it = {{0, 1}, {0, 1}};
    out[1] = setitimer(ITIMER_PROF, &it, nullptr) == -1 ? errno : 0;
    return;
  }
  if (mode == 8) { x[n + 100] = 2.0f; return; }  // past its buffer, in the block's last page
  if (mode == 10) {  // the floating-point state the last call left, then flush-to-zero and a rounding mode
    uint16_t cw;
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    out[0] = _mm_getcsr();
    out[1] = cw;
    _mm_setcsr(_mm_getcsr() | 0xE040);  // FTZ, DAZ, round toward zero
    cw |= 0x0C00;
    __asm__ volatile("fldcw %0" :: "m"(cw));
    return;
  }
  if (mode == 21) { out[0] = (int64_t)__rdtsc(); return; }
  if (mode == 30) {  // the GS base the last call left (by the system call: no FSGSBASE needed), then a mark
    unsigned long g = 1;
    out[1] = syscall(SYS_arch_prctl, 0x1004 /* ARCH_GET_GS */, &g);
    out[0] = (int64_t)g;
    out[2] = syscall(SYS_arch_prctl, 0x1001 /* ARCH_SET_GS */, 0x5a5a0000UL);
    return;
  }
  if (mode == 31) {  // system calls a loaded host refuses, and ones it keeps: each call's errno (0: done)
    auto e = [](long rc) -> int64_t { return rc == -1 ? errno : 0; };
    void* page = (void*)((uintptr_t)x & ~(uintptr_t)4095);  // the arena's shared memory
    struct timespec ts;
    struct timeval tv;
    struct sysinfo si;
    struct rusage ru;
    unsigned char vec[1];
    out[0] = e(syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts));
    out[1] = e(syscall(SYS_gettimeofday, &tv, nullptr));
    out[2] = e(syscall(SYS_time, nullptr));
    out[3] = e(syscall(SYS_getrusage, RUSAGE_SELF, &ru));
    out[4] = e(syscall(SYS_sysinfo, &si));
    out[5] = e(syscall(SYS_prctl, PR_SET_TSC, PR_TSC_ENABLE, 0, 0, 0));  // the time-stamp counter back on
    out[6] = e(syscall(SYS_mincore, page, 4096, vec));  // which of the arena's pages are resident
    out[7] = e(syscall(SYS_madvise, page, 4096, MADV_REMOVE));  // a hole punched in the arena
    out[8] = e(syscall(SYS_madvise, page, 4096, 21 /* MADV_PAGEOUT */));
    // a rival's sleep on its command word moved to another word (x[0] as the word here)
    out[9] = e(syscall(SYS_futex, (uint32_t*)x, FUTEX_CMP_REQUEUE, 0, (void*)1, (uint32_t*)x + 1, *(uint32_t*)x));
    const int fd = open("/etc/passwd", O_RDONLY);  // a file anywhere
    out[10] = fd < 0 ? errno : 0;
    out[16] = e(syscall(SYS_futex, (uint32_t*)x, FUTEX_WAKE, 1, nullptr, nullptr, 0));  // a rival roused
    struct stat st;
    out[17] = e(stat("/etc/passwd", &st));  // a file's times, by its path
    out[18] = e(fstat(1, &st));  // the log's, stamped at every write
    out[24] = e(syscall(SYS_fstat, first_fd(S_IFDIR), &st));  // the census folder's: the realtime clock at its open
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < 64; ++c) CPU_SET(c, &all);
    out[19] = e(sched_setaffinity(0, sizeof all, &all));  // more cores than the judge pinned it to
    struct timespec past = {1, 0};  // an absolute deadline: a comparator with the clock
    uint32_t w2 = 0;
    out[20] = e(syscall(SYS_futex, &w2, FUTEX_WAIT_BITSET_PRIVATE, 0, &past, nullptr, FUTEX_BITSET_MATCH_ANY));
    out[21] = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &past, nullptr);  // (returns the error)
    out[22] = e(syscall(SYS_membarrier, 0 /* MEMBARRIER_CMD_QUERY */, 0));
    if (fd >= 0) close(fd);
    // its own threads' /proc entries: a thread's CPU time to the nanosecond (schedstat), and the
    // scheduler's clock (sched's exec_start)
    char path[64] = "/proc/self/task/";
    int len = 16;
    char digits[16]; int d = 0; for (pid_t v = getpid(); v; v /= 10) digits[d++] = '0' + v % 10;
    while (d) path[len++] = digits[--d];
    std::strcpy(path + len, "/schedstat");
    const int own = open(path, O_RDONLY);
    out[11] = own < 0 ? errno : 0;
    if (own >= 0) close(own);
    std::strcpy(path + len, "/sched");
    const int own2 = openat(AT_FDCWD, path, O_RDONLY);
    out[23] = own2 < 0 ? errno : 0;
    if (own2 >= 0) close(own2);
    // kept: a thread, a private futex, memory given back, a sleep, printf
    int64_t ran = 0;
    std::thread([&ran] { ran = 1; }).join();
    uint32_t word = 0;
    out[12] = ran == 1 ? e(syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0)) : -1;
    void* q = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    out[13] = q == MAP_FAILED ? errno : e(madvise(q, 1 << 16, MADV_DONTNEED));
    if (q != MAP_FAILED) munmap(q, 1 << 16);
    const struct timespec nap = {0, 1000};
    out[14] = e(nanosleep(&nap, nullptr));
    out[15] = printf("a kernel's printf\n") > 0 && fflush(stdout) == 0 ? 0 : errno;
    return;
  }
  if (mode == 32) {  // the vDSO's clocks (glibc's, no system call for the coarse ones): each one's time
    struct timespec ts = {-1, -1};
    const clockid_t clocks[3] = {CLOCK_MONOTONIC_COARSE, CLOCK_REALTIME_COARSE, CLOCK_MONOTONIC};
    for (int i = 0; i < 3; ++i) {
      ts = {-1, -1};
      out[i] = clock_gettime(clocks[i], &ts) == 0 ? ts.tv_sec * 1000000000LL + ts.tv_nsec : -errno;
    }
    out[3] = time(nullptr);
    return;
  }
  if (mode == 24) { outlive_the_call(ctl); return; }
  if (mode == 25) { out[0] = forge(ctl); return; }  // an extra record: "nothing ran"
  if (mode == 26) {  // the census socket and directory closed, replaced or shut down: each refused (errno)
    const int sock = first_fd(S_IFSOCK), dir = first_fd(S_IFDIR);
    out[0] = close(sock) == -1 ? errno : 0;
    out[1] = dup2(0, sock) == -1 ? errno : 0;
    out[2] = dup3(0, dir, 0) == -1 ? errno : 0;
    out[3] = shutdown(sock, SHUT_WR) == -1 ? errno : 0;
    if (syscall(436, 3, ~0u, 0) == -1 && errno == EPERM) out[3] += 1000;  // close_range(3, ~0): refused
    return;
  }
  if (mode == 27) { forge(ctl); outlive_the_call(ctl); return; }  // "nothing ran" first, then a thread that did
  if (mode == 29) {  // a thread working on, and the host left no descriptor to look at it with
    std::thread([] { busy(3 * WORK); }).detach();
    struct rlimit r;
    getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = 0;
    out[0] = setrlimit(RLIMIT_NOFILE, &r) == -1 ? errno : 0;
    return;
  }
  if (mode == 28) {  // the host's record crowded out: its socket's buffer filled by one long message
    const int sock = first_fd(S_IFSOCK), one = 1;
    out[1] = setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &one, sizeof one) == -1 ? errno : 0;
    static char junk[4000];
    std::memcpy(junk, ctl, 4);  // (starts as a record of this command would)
    out[0] = write(sock, junk, sizeof junk);
    return;
  }  // the time-stamp counter (off: a fault)
  if (mode == 23) {  // a mapping grown or moved in place keeps its protection: refused after LOAD
    void* q = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* r = mremap(q, 4096, 8192, MREMAP_MAYMOVE);
    out[0] = r == MAP_FAILED ? errno : 0;
    munmap(r == MAP_FAILED ? q : r, r == MAP_FAILED ? 4096 : 8192);
    return;
  }
  if (mode == 22) {  // new executable memory: an anonymous page, the stack made executable, a personality
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    out[0] = p == MAP_FAILED ? errno : 0;
    volatile char here = 0;
    void* page = (void*)((uintptr_t)&here & ~(uintptr_t)4095);
    out[1] = mprotect(page, 4096, PROT_READ | PROT_WRITE | PROT_EXEC) == -1 ? errno : 0;
    out[2] = personality(READ_IMPLIES_EXEC) == -1 ? errno : 0;
    void* q = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);  // allowed
    out[3] = q == MAP_FAILED ? errno : 0;
    if (q != MAP_FAILED) munmap(q, 4096);
    return;
  }
  if (mode == 11) {  // the control block's text area (the judge writes it at LOAD only)
    volatile uint64_t* t = (volatile uint64_t*)((char*)ctl + 1024 + 2048);
    volatile uint64_t* st = (volatile uint64_t*)((char*)ctl + 48);
    out[0] = (int64_t)*t;
    out[1] = (int64_t)*st;
    *t = 0x5EEDF00Dull;
    *st = 0x5EEDF00Dull;
    return;
  }
  if (mode == 12 || mode == 13) {  // n units of work; 12 writes `done` first (ctl[1] = ctl[0])
    if (mode == 12) ctl[1] = ctl[0];
    work(n, x);
    return;
  }
  if (mode == 35) { syscall(SYS_tgkill, getpid(), getpid(), SIGSTOP); return; }  // its process stopped, mid-call
  if (mode == 36) {  // `done` written, then its process stopped: as if the census had asked for a listing
    ctl[1] = ctl[0];
    syscall(SYS_tgkill, getpid(), getpid(), SIGSTOP);
    return;
  }
  if (mode == 33) {  // many threads started and joined: the last ones joined may still be exiting at the return
    std::thread team[32];
    for (auto& t : team) t = std::thread([] {});
    for (auto& t : team) t.join();
    return;
  }
  if (mode == 14 || mode == 15) {  // the same work on a thread of its own, joined; 14 writes `done` first
    if (mode == 14) ctl[1] = ctl[0];
    std::thread t(work, n, x);
    t.join();
    return;
  }
  if (mode == 9) {  // a word n bytes below this frame: what the last call left there, then a mark
    volatile char here = 0;
    volatile uint64_t* p = (volatile uint64_t*)((uintptr_t)(&here - n) & ~(uintptr_t)7);
    out[0] = (int64_t)*p;
    *p = 0x5EEDF00Dull;
    return;
  }
  busy(WORK);
}
"""


# the test library's entry: k(mode, x, n, ctl (this host's control block, in the host), out)
KINDS = ["i64", "ptr", "i64", "i64", "ptr"]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("host")
    src, so = d / "k.cpp", d / "k.so"
    src.write_text(LIB)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    return str(so)


@pytest.fixture()
def rig(lib):
    arena, census = host.Arena(1 << 26), host.HostCensus()
    h = host.Host(arena, lib, "k", KINDS, census)
    census.hosts, census.arena = [h], arena
    x = arena.tensor(torch.zeros(4096))
    out = arena.tensor(torch.zeros(4, dtype=torch.int64))
    ctl = h.host_ctl  # the candidate can find its control block anyway: here it is told

    def call(mode):
        return host.HostCall(h, [mode, x.data_ptr(), x.numel(), ctl, out.data_ptr()])

    yield h, census, x, out, call
    h.close()


def test_an_honest_call_runs_in_the_host_and_is_timed_by_the_judge(rig):
    h, census, x, out, call = rig
    assert h.confined and h.pid != __import__("os").getpid()
    c = call(0)
    c()
    assert float(x[0]) == 1.0 and float(x[-1]) == 1.0
    t = min(c.timed() for _ in range(20))
    assert 0 < t < 5e-3
    assert float(x[0]) == 21.0
    assert census.take() is None


def test_a_host_in_uninterruptible_sleep_is_not_taken_as_asleep(rig, monkeypatch):
    """D (inside a page fault or an I/O) is a host on its way somewhere, not its loop's wait: the
    judge reads the host's CPU time only once it sleeps (S), else what the rest of that way costs
    lands between calls and an honest kernel is `wrong`."""
    h, census, x, out, call = rig
    real, seen = h._state, []

    def state():
        st = real()
        if st == b"S" and seen.count(b"D") < 50:
            st = b"D"  # asleep, but shown as in uninterruptible sleep the first 50 times
        seen.append(st)
        return st

    monkeypatch.setattr(h, "_state", state)
    call(0)()
    assert seen.count(b"D") == 50 and b"S" in seen[seen.index(b"D"):], seen[:60]
    assert census.take() is None


WORK = 2_000_000  # the library's WORK: about 8 ms of CPU


def _work_s(lib: str, units: int, n: int = 5) -> float:
    """The least CPU time of `units` of the library's work (mode 13), called here in this process
    (no host, no scheduler's wait)."""
    k = ctypes.CDLL(lib).k
    k.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    buf = (ctypes.c_float * 16)()
    best = float("inf")
    for _ in range(n):
        t0 = time.thread_time()
        k(13, buf, units, None, None)
        best = min(best, time.thread_time() - t0)
    return best


def test_a_done_written_by_the_kernel_does_not_stop_the_clock(lib, rig):
    """`done` is in the host's memory, so the kernel can write it and go on working: the judge
    times until the host is asleep again, so the work is charged all the same."""
    h, census, x, out, call = rig
    work = _work_s(lib, WORK)
    assert work > 1e-3, work
    assert call(4).timed() > 0.9 * work  # the work, honestly timed
    forged = call(1).timed()
    # charged: the time to asleep beyond the host's own (calibrated) gap; without it, ~10 us
    assert forged > 0.9 * work - h.down_allow, (forged, work, h.down_allow)


def test_work_resumed_on_the_next_command_is_caught(rig):
    """The kernel writes `done` and sleeps on the command word itself, to wake with the judge's
    next post and finish its work before the host's `ack` (a gap the judge cannot charge: the
    host's own wake-up takes milliseconds after an idle spell). Asleep, it is not where the
    host's loop sleeps (the same futex, but another stack pointer: calibrated before the
    library was loaded)."""
    h, census, x, out, call = rig
    assert h.loop_where is not None  # /proc/<pid>/syscall readable here: the check is on
    call(2).timed()  # leaves the main thread asleep inside the kernel
    why = census.take()
    assert why is not None and "asleep inside its call" in why, why
    call(0).timed()


def _timed(call, n=31) -> tuple[float, float]:
    """(least, median) of n timed calls. The judge's figure is a median; on a loaded machine an
    honest call's median is the scheduler's (preempted for milliseconds) and its least the work's,
    so a cheat's median is held to the honest least."""
    ts = sorted(call.timed() for _ in range(n))
    return ts[0], ts[n // 2]


@pytest.mark.parametrize("first, plain", [(12, 13), (14, 15)], ids=["main thread", "thread of its own"])
def test_work_after_a_done_written_first_is_timed(lib, first, plain):
    """`done` is in the host's memory: a kernel that writes it first and then works stopped the
    judge's clock at once, and only the gap beyond the host's own allowance (tens of us, a whole
    small kernel) was charged (session 37's red team: a moe-cpu variant timed 3 to 6x faster than
    the same kernel). The CPU the host spends from its sleep before the call to its sleep after it
    bounds the time, on the main thread or on a thread of its own (the host's calls run on
    runtime.threads cores: one here)."""
    arena, census = host.Arena(1 << 24), host.HostCensus()
    h = host.Host(arena, lib, "k", KINDS, census, threads=1)
    census.hosts, census.arena = [h], arena
    try:
        x = arena.tensor(torch.zeros(16))
        ctl = h.host_ctl
        units = 12_000  # about 50 us of work: less than the gap allowance (60 to 100 us)
        calls = {m: host.HostCall(h, [m, x.data_ptr(), units, ctl, 0]) for m in (first, plain)}
        honest = min(_work_s(lib, units, 20), _timed(calls[plain])[0])
        assert honest > 20e-6 and census.take() is None, honest
        early = _timed(calls[first])[1]
        if first == 12:
            # without the CPU bound: about 2 us against 50 (a ratio of 0.04)
            assert early > 0.7 * honest, (early, honest, h.down_allow)
            assert census.take() is None
        else:
            # timed in full (the thread's CPU is the process's once it is joined), or, where the
            # judge found the main thread asleep in its join when the call said it was done,
            # caught as such
            why = census.take()
            assert (why is not None and "asleep inside its call" in why) or (why is None and early > 0.7 * honest), \
                (why, early, honest)
    finally:
        h.close()


def test_work_before_go_is_caught_or_charged(tmp_path):
    """Session 37's second red team: the kernel reaches the host's interpreter (PyRun_SimpleString
    through dlsym, found from libc's own tables), wraps what the host's loop calls right before
    `ack`, and does the call's work there, before `go`, sleeping on `go` in short timed waits
    (redoing it after the judge's refresh). The judge waits for the host to sleep on `go` where
    its loop does (calibrated): this one sleeps elsewhere, and is caught; and were it to sleep
    in the same place, the CPU it spent before `go` beyond the host's own path is charged."""
    import random

    src = Path(__file__).resolve().parents[1] / "datasets" / "judge-redteam" / "s37b" / "primed.cpp"
    so = tmp_path / "primed.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    ref = ctypes.CDLL(str(so)).ref
    ref.restype, ref.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_int64]
    steps = 30_000  # about 50 us of work

    def least_and_notes(mode, place_check=True):
        arena, census = host.Arena(1 << 24), host.HostCensus()
        h = host.Host(arena, str(so), "k", ["i64", "ptr", "i64", "ptr", "i64"], census, threads=1)
        census.hosts, census.arena = [h], arena
        if not place_check:
            h.go_where = None
        try:
            x, y = arena.tensor(torch.rand(16)), arena.tensor(torch.zeros(16))
            c = host.HostCall(h, [mode, x.data_ptr(), steps, y.data_ptr(), h.host_ctl])
            for _ in range(3):
                c()
            rng, times, notes = random.Random(1), [], []
            for _ in range(21):
                h.prime(c.words)  # the judge's order: `ack` (and the sleep on `go`), the refresh, the call
                x.copy_(torch.rand(16, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))))
                times.append(c.timed())
                census.check()
                assert float(y[0]) == ref(x.data_ptr(), steps)  # right on every call: only time tells
                why = census.take()
                if why:
                    notes.append(why)
            ts = sorted(times)  # (least, median): see _timed
            return (ts[0] if mode == 0 else ts[len(ts) // 2]), notes
        finally:
            h.close()

    honest, notes = least_and_notes(0)
    assert notes == [] and honest > 20e-6, (honest, notes)
    xs = (ctypes.c_float * 16)(*[0.5] * 16)
    t0 = time.thread_time()
    for _ in range(20):
        ref(ctypes.addressof(xs), steps)
    honest = min(honest, (time.thread_time() - t0) / 20)  # the work's own CPU time, here in this process
    cheat, notes = least_and_notes(1)
    assert notes and all("slept somewhere other than its loop's wait for `go`" in n for n in notes), notes
    # the place check off: the CPU spent before `go` is charged (without it: 0.05 to 0.2 of honest)
    cheat, notes = least_and_notes(1, place_check=False)
    assert cheat > 0.7 * honest, (cheat, honest, notes)


def test_the_kernel_cannot_signal_or_read_the_worker(rig):
    h, census, x, out, call = rig
    call(3)()
    tgkill, setprio, mem, itself = (int(v) for v in out)
    assert tgkill == errno.EPERM and setprio == errno.EPERM
    assert mem in (errno.EACCES, errno.EPERM)  # the worker is not dumpable; the host has no capabilities
    assert itself == 0  # its own threads it may signal (glibc's abort, raise)


def test_a_pointer_outside_the_arena_is_refused(rig):
    h, census, x, out, call = rig
    private = torch.zeros(16)
    with pytest.raises(ValueError):
        host.HostCall(h, [0, private.data_ptr(), 16, 0, 0])


def test_a_freed_block_comes_back_zero():
    arena = host.Arena(1 << 22)
    t = arena.tensor(torch.full((1024,), 7.0))
    off = t.data_ptr() - arena.base
    del t
    again = arena.tensor(torch.empty(1024).fill_(0.0).add_(0))  # the same first-fit block
    assert again.data_ptr() - arena.base == off
    raw = (ctypes.c_float * 1024).from_address(arena.base + off)
    assert raw[0] == 0.0


def test_a_crashing_kernel_kills_its_host_only(lib, tmp_path):
    src, so = tmp_path / "crash.cpp", tmp_path / "crash.so"
    src.write_text('extern "C" void k(long m) { if (m) *(volatile int*)8 = 1; }')
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    arena, census = host.Arena(1 << 22), host.HostCensus()
    h = host.Host(arena, str(so), "k", ["i64"], census)
    host.HostCall(h, [0])()
    with pytest.raises(host.HostDied, match="SIGSEGV"):
        host.HostCall(h, [1])()
    h.close()


def test_the_control_block_layout_fits():
    assert kh.ARGS_AT + 8 * kh.MAX_ARGS <= kh.KINDS_AT and kh.KINDS_AT + kh.MAX_ARGS <= kh.TEXT_AT
    assert kh.TEXT_AT + kh.TEXT_BYTES <= kh.CTL_BYTES
    assert platform.machine() in ("x86_64", "AMD64")


def test_a_host_working_while_another_is_called_is_caught(lib, rig, monkeypatch):
    """Host A writes `done` and sleeps, so the judge sees it asleep and moves on to host B; A
    then works while B's calls are timed (for B, or in its gaps). Every host is watched at every
    post and after every call, not only the one being called."""
    h, census, x, out, call = rig
    other = host.Host(h.arena, lib, "k", KINDS, census)
    census.hosts = [h, other]
    try:
        b = host.HostCall(other, [0, x.data_ptr(), x.numel(), 0, out.data_ptr()])
        # A asleep inside its kernel, its call "done": seen asleep outside the host's loop
        # (test_work_resumed_on_the_next_command_is_caught), and no census record from it
        # (test_a_census_record_missing_or_forged_is_caught); here as if it slept exactly
        # where the loop does and had reported, so that only the watch of every host can see
        # what follows
        h.loop_where = None
        monkeypatch.setattr(h, "_reported", lambda: None)
        for _ in range(5):
            t = call(5).timed()
            assert census.take() is None
            if t < 0.02:
                break
            # the judge itself was held up past A's sleep (a loaded machine): it saw A's work
            # before A slept again, and charged it to the call. Honest, but not the case here
        else:
            pytest.fail("the judge never saw host A asleep within 20 ms of its post")
        time.sleep(0.05)  # A wakes 20 ms after `done` and works 8 ms
        t0 = time.monotonic()  # on a loaded machine, A may be scheduled late: wait for its work
        while h._cpu() - h.cpu_after < 2 * host.IDLE_BLIP_S and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        b.timed()
        why = census.take()
        assert why is not None and "ran between calls" in why, why
    finally:
        other.close()


def test_a_write_outside_the_buffers_is_caught(rig):
    h, census, x, out, call = rig
    call(0)()
    assert census.take() is None  # the control: its own buffers only (the arena checked, always)
    call(6)()
    why = census.take()
    assert why is not None and "outside the buffers" in why, why


def test_the_free_space_is_punched_between_requests():
    arena = host.Arena(1 << 24)
    keep = arena.tensor(torch.ones(1024))
    raw = (ctypes.c_float * 1).from_address(arena.base + (8 << 20))
    raw[0] = 3.0  # a memo in the free space
    assert arena.stray_data() is not None
    arena.punch_free()
    assert arena.stray_data() is None  # (before the read below, which would fault a page in)
    assert raw[0] == 0.0
    assert float(keep[0]) == 1.0  # the live block is untouched


def test_the_host_refuses_signal_handlers_and_timers(rig):
    """A CPU-time timer's handler fires while the host spins on `go`, outside any call."""
    h, census, x, out, call = rig
    call(7)()
    assert int(out[0]) == errno.EPERM and int(out[1]) == errno.EPERM


def test_a_write_past_the_buffer_in_its_own_page_is_caught(rig):
    """The bytes past a block's own, in its last page and the slack page after it, must stay
    zero: a memo there would live as long as the block."""
    h, census, x, out, call = rig
    call(0)()
    assert census.take() is None
    call(8)()
    why = census.take()
    assert why is not None and "outside the buffers" in why, why


def test_the_host_has_acknowledged_before_the_judge_refreshes_the_inputs(rig):
    """The judge's scrub hook (ahead of its refresh and flush) primes the host and returns only
    once the host has acknowledged: whatever a kernel does before that (woken by the post, it
    may have slept inside its last call) runs before the inputs of the call to come exist."""
    h, census, x, out, call = rig
    c = call(0)
    c.scrub(1 << 20)
    assert h.pending is not None and h.u32[kh.ACK // 4] == h.pending
    assert c.timed() > 0 and h.pending is None


def test_the_arena_is_checked_after_about_one_call_in_eight(rig):
    """After a call, the census checks the arena at random, one call in ARENA_EVERY: a write
    outside the buffers is found by some call of a loop, whichever."""
    h, census, x, out, call = rig
    call(6)()  # the write, then calls that leave it there
    found = 0
    for _ in range(64):
        call(0)()
        found += census.check() is not None
        census.why = None
    assert 1 <= found <= 40  # at random: neither never nor always


def test_no_stack_below_a_call_keeps_a_value_for_the_next_one(lib, rig):
    """A memo kept in the stack below the scrub's reach (2.5 MiB down, where the stack may
    grow to 8 MiB) answered a compute-bound op from its last calls (a red team, session 35).
    The host's stack may now grow only as far below the call as its scrub covers, and the
    scrub covers all of it: a mark left anywhere down there is gone by the next call, and a
    kernel that goes deeper faults."""
    h, census, x, out, call = rig
    for depth in (64 << 10, (1 << 20) + (64 << 10), (1 << 20) + (160 << 10)):
        c = host.HostCall(h, [9, x.data_ptr(), depth, 0, out.data_ptr()])
        c()
        c()  # the first call's mark, if anything kept it
        assert int(out[0]) == 0, (depth, hex(int(out[0])))
    assert census.take() is None
    arena2, census2 = host.Arena(1 << 22), host.HostCensus()
    h2 = host.Host(arena2, lib, "k", KINDS, census2)
    out2 = arena2.tensor(torch.zeros(4, dtype=torch.int64))
    x2 = arena2.tensor(torch.zeros(16))
    with pytest.raises(host.HostDied, match="SIGSEGV"):
        host.HostCall(h2, [9, x2.data_ptr(), 5 << 20, 0, out2.data_ptr()])()
    h2.close()


def test_no_floating_point_mode_or_control_word_outlives_a_call(rig):
    """MXCSR's flush-to-zero, denormals-are-zero and rounding bits, the x87 control word, and
    the control block's words the judge writes only at LOAD all held a mark from one call to
    the next (session 35's second red team): the host sets them back before every call."""
    h, census, x, out, call = rig
    c = call(10)
    c()
    c()
    assert int(out[0]) & 0xFFC0 == 0x1F80 and int(out[1]) & 0x0F3F == 0x033F, (hex(int(out[0])), hex(int(out[1])))
    c = call(11)
    c()
    c()
    assert int(out[0]) == 0 and int(out[1]) == 0, (hex(int(out[0])), hex(int(out[1])))


def test_no_gs_base_outlives_a_call(rig):
    """The GS segment's base is a register a call can write (`wrgsbase`, or the system call) and
    read back on the next call, holding a mark or a call count outside memory (session 53's CPU
    red team): the host sets it to zero before every call."""
    h, census, x, out, call = rig
    c = call(30)
    c()
    assert int(out[1]) == 0 and int(out[2]) == 0, out  # both system calls went through
    c()
    assert int(out[0]) == 0 and int(out[1]) == 0, hex(int(out[0]))  # the last call's mark is gone


def test_a_call_that_leaves_the_floating_point_control_state_changed_is_fast_math(rig):
    """Session 39's CPU red team set flush-to-zero from code no reader saw (bytes hidden in a
    constant, libm's own fesetenv): whatever the route, the host reads the control state as the
    kernel returns, and the census says fast math; an honest call says nothing."""
    h, census, x, out, call = rig
    call(0)()
    assert census.take() is None
    call(10)()
    why = census.take()
    assert why is not None and why.startswith("fast_math:") and "control state" in why, why



def test_no_new_executable_memory_once_the_library_is_loaded(rig):
    """Session 39's CPU red team copied an approximate rsqrt into a page it made executable and
    called it: code no reader of the compiled code saw. Once its library is loaded, the host
    makes no executable memory (mmap, mprotect, personality); plain memory still comes."""
    h, census, x, out, call = rig
    call(22)()
    assert [int(v) for v in out] == [errno.EPERM, errno.EPERM, errno.EPERM, 0], out
    call(23)()  # (the second CPU red team grew the library's code mapping over its constants)
    assert int(out[0]) == errno.ENOMEM, out


def test_a_kernel_that_reads_the_time_stamp_counter_faults(rig):
    """The host turns the time-stamp counter off before it loads a library (PR_SET_TSC): a kernel
    that keyed its work on `__rdtsc()` was slow in most rounds of a comparison and fast in one
    (session 38's fourth red team). It now dies on its first call, and the judge says so."""
    h, census, x, out, call = rig
    call(0)()  # an honest call first: the host itself reads no clock
    with pytest.raises(host.HostDied, match="SIGSEGV"):
        call(21)()


def test_a_loaded_host_allows_only_its_loop_and_what_a_kernel_needs(lib, rig):
    """Once its library is loaded, the host stacks an allow list (sandbox.LOOP_ALLOW), which has no
    open, and where the kernel has Landlock, grants no file. A kernel reaches any system call
    through libc's `syscall` (found from an import it may use, session 64's red team): with the deny
    list alone it read the time by clock_gettime (the time-stamp counter off, the clock it keyed
    its work on came back by a system call, or by prctl turning the counter on again), read any
    file, saw which of the arena's pages were resident, punched or paged out the arena's memory
    and could move a rival host's sleep to another futex. Session 64's list still let it open its
    own threads' /proc entries (the census read their flags there), where a thread's CPU time and
    the scheduler's clock are, to the nanosecond."""
    h, census, x, out, call = rig
    res = h.arena.tensor(torch.full((25,), -7, dtype=torch.int64))
    host.HostCall(h, [31, x.data_ptr(), 0, 0, res.data_ptr()])()
    got = [int(v) for v in res]
    refused = {"clock_gettime": 0, "gettimeofday": 1, "time": 2, "getrusage": 3, "sysinfo": 4,
               "prctl": 5, "mincore": 6, "madvise REMOVE": 7, "madvise PAGEOUT": 8, "futex CMP_REQUEUE": 9,
               "futex WAKE, shared": 16, "stat by path": 17, "fstat of the log": 18, "sched_setaffinity": 19,
               "futex deadline": 20, "clock_nanosleep deadline": 21, "membarrier": 22, "a file anywhere": 10,
               "its thread's schedstat": 11, "its thread's sched": 23, "fstat of the census folder": 24}
    assert {k: got[i] for k, i in refused.items()} == {k: errno.EPERM for k in refused}, got
    assert got[12:16] == [0] * 4, got  # a thread, a private futex, madvise, a sleep, printf
    assert census.take() is None
    call(0)()  # and the host's loop goes on
    assert float(x[0]) >= 1.0 and census.take() is None
    call(32)()  # the vDSO's clocks: the coarse ones and `time` read zeros, the others are refused
    assert [int(v) for v in out] == [0, 0, -errno.EPERM, 0], out


def test_a_kernel_asleep_on_a_rival_hosts_word_steals_no_wake(lib, rig):
    """Every host of a request maps the whole arena, so a kernel's thread can sleep on a rival
    host's command word (a shared futex wait, which a join needs and the allow list keeps). Woken
    one waiter at a time, the rival would have slept on while the thief woke, its command never
    acknowledged (session 64's review: the rival's request timed out). The judge wakes every
    waiter on a host's words."""
    import threading

    h, census, x, out, call = rig
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    seq = ctypes.c_void_p(h.ctl_addr + kh.SEQ)
    word = (ctypes.c_uint32 * 1).from_address(seq.value)
    woke = []

    def thief(value: int) -> None:  # queued on the word once the call is posted, before the host sleeps again
        class Ts(ctypes.Structure):
            _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
        t0 = time.monotonic()
        while word[0] != value and time.monotonic() - t0 < 5:
            pass
        rc = libc.syscall(ctypes.c_long(kh.SYS_FUTEX), seq, kh.FUTEX_WAIT, ctypes.c_uint32(value),
                          ctypes.byref(Ts(5, 0)), None, 0)
        woke.append(rc)

    for _ in range(3):
        t = threading.Thread(target=thief, args=(word[0] + 1,))
        c = call(4)  # about 8 ms of work: the thief waits on the call's sequence number meanwhile
        t.start()
        c()
        c()  # the judge's next post wakes the host, and the thief with it
        t.join(10)
        assert woke and woke[-1] == 0, woke  # woken by the post, not by its own timeout
    assert census.take() is None


def _ctl_files(pid: int) -> set[str]:
    """The inodes of the control-block files a host maps (memfd "pipe-host-ctl")."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[4] for line in f if "pipe-host-ctl" in line}


def test_no_host_maps_another_hosts_control_block(lib, rig):
    """Every host of a request maps the whole arena, and the control blocks were in it: a kernel
    read a rival's command count there (its place in a round), and a thread's exit (the kernel's
    own write of 0 and wake at its clear_child_tid, which the filter never sees) aimed at a rival's
    command word woke the rival on a command the judge never posted, and its next request hung
    (session 65's red team). Each host's control block is now a file of its own: no other host
    maps it, so no kernel can name its words."""
    h, census, x, out, call = rig
    other = host.Host(h.arena, lib, "k", KINDS, census)
    census.hosts = [h, other]
    try:
        mine, theirs = _ctl_files(h.pid), _ctl_files(other.pid)
        assert len(mine) == 1 and len(theirs) == 1 and mine != theirs, (mine, theirs)
        with open(f"/proc/{h.pid}/maps") as f:
            assert any("pipe-arena" in line for line in f)  # (the arena is shared, as before)
        call(0)()
        host.HostCall(other, [0, x.data_ptr(), x.numel(), other.host_ctl, out.data_ptr()])()
        assert float(x[0]) == 2.0 and census.take() is None
    finally:
        other.close()


def test_cpu_between_commands_is_forgiven_once_and_small(rig):
    """An honest host asleep in its loop was charged 177 and 291 us between commands on a loaded
    machine, once in a few thousand: once in a host's life, up to IDLE_BLIP_S is forgiven; a
    second time, or more than that, is work outside the timed call."""
    h, census, x, out, call = rig
    call(0)()
    assert h.idle_problem() is None
    h.cpu_after -= 200e-6  # as if the host had spent 200 us since its last command
    assert h.idle_problem() is None and h.blipped
    h.cpu_after -= 200e-6  # and again
    assert "ran between calls" in (h.idle_problem() or "")
    h.blipped = False
    h.cpu_after -= 2 * host.IDLE_BLIP_S  # more than a blip, the first time
    assert "ran between calls" in (h.idle_problem() or "")


def test_the_hosts_cpu_time_is_read_only_once_it_is_off_its_cpu(rig, monkeypatch):
    """A thread's state reads S from the moment it starts to sleep, while it is still on its CPU
    switching out, and the CPU clock of another process's thread still on a CPU stands at its
    last tick or switch: two equal readings then do not mean its time is all counted. On a loaded
    two-core VM an honest host seen so was charged its own call (60 us to 2.4 ms) as CPU time
    between commands, and `wrong`. Here the state always reads S, as it can for that moment: the
    judge must wait until the kernel says the thread has left its CPU (_switched_out), and then no
    CPU time lands between commands, call after call of about 4 ms each (reads of a stale clock
    would miss the time since the last tick)."""
    h, census, x, out, call = rig
    long_call = host.HostCall(h, [13, x.data_ptr(), 2_500_000, 0, out.data_ptr()])
    long_call()  # before the state is faked: calibrated, settled
    monkeypatch.setattr(h, "_state", lambda: b"S")
    h.blipped = True  # nothing forgiven: any CPU time between commands counts
    spent = []
    for _ in range(6):
        t0 = h.cpu_after
        long_call()
        spent.append(h.cpu_after - t0)
        assert h.idle_problem() is None, (spent, h.cpu_after)
    assert min(spent) > 1e-3, spent  # the calls did work the clock counted
    assert census.take() is None


def _alone_again(h) -> None:
    """Until the host runs its main thread alone again: the threads of `outlive_the_call` end when
    they see it asleep, which between two quick commands on a loaded machine they can miss."""
    t0 = time.monotonic()
    while len(os.listdir(f"/proc/{h.pid}/task")) > 1 and time.monotonic() - t0 < 10:
        time.sleep(0.001)


def test_a_thread_that_outlives_its_call_by_moments_is_caught(rig):
    """A thread of the kernel's alive when its call returns, which ends as soon as the host is
    asleep again: the judge lists the host's threads only once it is asleep, and never saw it
    (the `deferred_thread` red-team kernel passed so on an idle machine, session 44). The host
    counts its own threads at once after the call, before it can sleep, and reports the count on
    a socket only the judge reads."""
    h, census, x, out, call = rig
    mark = f"{h.pid}/census"  # what the host's own count convicts (Host._reported)
    for _ in range(3):
        call(24)()
        census.check("the call")  # the judge's own listing too, as after every call
        why = census.take()
        # the first finding is the verdict's reason: from the second call on it can be the CPU
        # the last call's thread spent after the host slept (idle_problem), also this class
        assert why is not None and "work outside the timed call" in why, why
        assert mark in census.convicted, why  # the host's count saw this call's thread
        census.convicted.discard(mark)
        _alone_again(h)
    # the CPU the last thread spent after the host slept is the loop's (idle_problem would charge
    # it to the next command): the host's baseline taken again once the threads are gone
    h.cpu_after = h._cpu()
    census.take()
    call(0)()  # the control: the threads are gone, the host's census clean again
    census.check("the call")
    assert census.take() is None


def test_threads_joined_inside_the_call_pass_the_hold(rig):
    """The census's other side: a thread joined before the call returns may still be listed for a
    few microseconds while it exits (its flags say so). The host cannot read those flags (it opens
    no file), so it stops itself whenever it counts more than its main thread, and the judge lists
    them: an exiting thread passes, every call."""
    h, census, x, out, call = rig
    for _ in range(300):
        call(33)()  # 32 threads started and joined
        assert census.take() is None
    census.check("the calls")
    assert census.take() is None


def test_a_kernel_that_stops_its_own_process_is_caught(rig):
    """The census stops its process (SIGSTOP) for the judge's listing, and a kernel may send the
    same signal to its own process. Stopped inside its call, the host never answers: the judge
    said nothing and waited for good (session 65's red team). Stopped after writing `done` itself,
    the judge took the stop for the census's, and a later stop could then be cancelled unseen.
    The first is the host stopped inside its call; the second, a stop with no record asking for
    it."""
    import signal
    import threading

    h, census, x, out, call = rig
    rescue = threading.Timer(20, lambda: os.kill(h.pid, signal.SIGCONT))  # a hang fails, not hangs
    rescue.start()
    try:
        with pytest.raises(host.HostDied, match="stopped itself"):
            call(35)()
    finally:
        rescue.cancel()
    h.close()


def test_a_stop_the_census_did_not_ask_for_is_a_finding(rig):
    """(The second half of the test above: `done` written, then the process stopped.)"""
    h, census, x, out, call = rig
    call(36)()
    why = census.take()
    assert why is not None and "stopped itself after its call" in why, why
    call(0)()
    assert census.take() is None


def test_a_census_record_missing_or_forged_is_caught(rig):
    """The census socket is in the kernel's process: the kernel can add records to it, not take one
    back, nor close, replace or shut down the host's end of it (the filter). Exactly one record a
    command, for that command: an extra one, or the host's crowded out, is a finding; a forged
    "none" ahead of the host's count hides no thread."""
    h, census, x, out, call = rig
    call(26)()
    assert [int(v) for v in out] == [errno.EPERM] * 3 + [errno.EPERM + 1000], out
    assert census.take() is None  # the host's own record came, as every command's does
    call(25)()
    assert int(out[0]) == 8  # a record of its own, written
    why = census.take()
    assert why is not None and "did not report its thread census once" in why and "2 records" in why, why
    call(27)()
    why = census.take()
    assert why is not None and "still running after the call returned" in why, why
    _alone_again(h)
    h.cpu_after = h._cpu()  # (the CPU its thread spent after the host slept: charged to the next command)
    census.take()
    call(28)()
    # its send buffer cannot be shrunk to crowd the host's record out (the allow list refuses
    # setsockopt), and the long message beside that record is a finding all the same
    assert int(out[1]) == errno.EPERM, out
    why = census.take()
    assert why is not None and "did not report its thread census once" in why and "2 messages" in why, why
    call(0)()
    assert census.take() is None


def test_a_thread_the_host_cannot_look_at_counts(rig):
    """A kernel that leaves its process no descriptor to spare (its limit lowered to 0) while a
    thread of its works on: the host counts by the descriptor it opened before the library, and
    the judge lists from its own process, so the thread counts, and does not vanish."""
    h, census, x, out, call = rig
    call(29)()
    assert int(out[0]) == 0  # the limit lowered
    why = census.take()
    assert why is not None and "still running after the call returned" in why, why
    _alone_again(h)
    call(0)()  # (the thread's CPU between the calls is found too: work outside the call)
    census.take()
    call(0)()  # one thread again: counted without a descriptor
    assert census.take() is None
