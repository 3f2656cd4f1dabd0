// s37b probes of the other classes, in the bare harness (harness_probes.py). k(mode, x, n, y, m):
//   0: honest, n steps on the main thread
//   1: affinity escape: a thread sets its own affinity to every core (sched_setaffinity(0) is
//      allowed: PID_ARGS lets a thread name itself), then main and it do n/2 steps each, joined
//   2: a thread that outlives the call: main starts a detached thread of m steps and does n - m
//      itself; the thread's result lands in y[1] before it exits (after the host is asleep)
//   3: the same work as 2, honest (the m steps joined on a thread)
#include <cstdint>
#include <thread>
#include <unistd.h>
#include <sys/syscall.h>

static float work(const float* x, int64_t n) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; ++i) a = a * 0.999f + x[i & 15];
  return a;
}

extern "C" void k(int64_t mode, float* x, int64_t n, float* y, int64_t m) {
  if (mode == 0) { y[0] = work(x, n); return; }
  if (mode == 1) {
    std::thread t([&] {
      uint64_t all = ~uint64_t(0);
      syscall(SYS_sched_setaffinity, 0, sizeof all, &all);
      y[1] = work(x, n / 2);
    });
    y[0] = work(x, n - n / 2);
    t.join();
    return;
  }
  if (mode == 2) {
    std::thread([x, y, m] { y[1] = work(x, m); }).detach();
    y[0] = work(x, n - m);
    return;
  }
  if (mode == 3) {
    std::thread t([x, y, m] { y[1] = work(x, m); });
    y[0] = work(x, n - m);
    t.join();
    return;
  }
}
extern "C" float ref(const float* x, int64_t n) { return work(x, n); }
