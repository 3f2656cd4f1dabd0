// (a copy of datasets/judge-redteam/s37b/primed.cpp: tests/test_kernel_host.py::test_work_before_go_is_caught_or_charged)
// s37b attack P: the host's sleep on `go` after `ack` is not charged and not bounded (the judge
// waits for it, cpu_host.Host._asleep_on_go); the kernel runs its work there, after the judge's
// input refresh, through the host's own interpreter.
//
// k(mode, x, n, y, ctl): y[0] = work over x[0..15], n steps.
//   mode 0: honest, the work in the call.
//   mode 1: the cheat. Its first call binds the host's interpreter (PyGILState_Ensure and
//           PyRun_SimpleString found with dlsym, itself found through libc's ELF tables from
//           &memcpy: no import) and wraps `ctypes.memset`, which the host's loop calls on the
//           control block right before its `ack`; the wrapper calls `pre` below, which writes
//           `ack` itself, does the work on the inputs as they are, and sleeps on `go` in short
//           timed waits, redoing the work whenever the inputs changed (the judge's refresh),
//           until the judge wakes it. The timed call then finds its answer ready and returns.
// `ctl` is passed in to keep this small (s37's moe_early_done.cpp.j2 finds it from inside).
#include <cstdint>
#include <cstring>

namespace {
struct Phdr { uint32_t type, flags; uint64_t off, vaddr, paddr, filesz, memsz, align; };
struct Sym { uint32_t name; uint8_t info, other; uint16_t shndx; uint64_t value, size; };
inline uintptr_t elf_base(uintptr_t p) {
  p &= ~uintptr_t(4095);
  for (int i = 0; i < 100000; ++i, p -= 4096)
    if (*reinterpret_cast<volatile const uint32_t*>(p) == 0x464c457fu) return p;
  return 0;
}
inline bool is(const char* a, const char* b) { while (*a && *a == *b) { ++a; ++b; } return *a == *b; }
inline uintptr_t lookup(uintptr_t b, const char* want) {
  const Phdr* ph = reinterpret_cast<const Phdr*>(b + *reinterpret_cast<const uint64_t*>(b + 0x20));
  int n = *reinterpret_cast<const uint16_t*>(b + 0x38);
  const uint64_t* dyn = nullptr;
  for (int i = 0; i < n; ++i) if (ph[i].type == 2) dyn = reinterpret_cast<const uint64_t*>(b + ph[i].vaddr);
  if (!dyn) return 0;
  uint64_t symtab = 0, strtab = 0;
  for (; dyn[0]; dyn += 2) { if (dyn[0] == 6) symtab = dyn[1]; if (dyn[0] == 5) strtab = dyn[1]; }
  if (symtab < b) symtab += b;
  if (strtab < b) strtab += b;
  const Sym* s = reinterpret_cast<const Sym*>(symtab);
  const int64_t count = int64_t(strtab - symtab) / 24;
  for (int64_t i = 0; i < count; ++i)
    if (s[i].value && (s[i].info & 15) == 2 && is(reinterpret_cast<const char*>(strtab + s[i].name), want))
      return b + s[i].value;
  return 0;
}

float work(const float* x, int64_t n) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; ++i) a = a * 0.999f + x[i & 15];
  return a;
}

// kernel_host.py's control block
constexpr int SEQ = 0, GO = 12, ACK = 16, ARGS_AT = 64, KINDS_AT = 64 + 8 * 64;
typedef long (*syscall_fn)(long, ...);
syscall_fn sys_ = nullptr;
float snap[16];
bool ready = false;
int hooked = 0;

inline bool same(const float* x) {
  for (int i = 0; i < 16; ++i) if (reinterpret_cast<const volatile uint32_t*>(x)[i] != reinterpret_cast<const uint32_t*>(snap)[i]) return false;
  return true;
}

char* put(char* o, const char* s) { while (*s) *o++ = *s++; return o; }
char* hex(char* o, uint64_t v) {
  o = put(o, "0x");
  char d[16]; int k = 0;
  do { d[k++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
  while (k) *o++ = d[--k];
  return o;
}
}  // namespace

// called by the wrapped ctypes.memset with the address of the control block's kinds area
extern "C" void pre(uintptr_t kinds_at) {
  volatile uint32_t* c = reinterpret_cast<volatile uint32_t*>(kinds_at - KINDS_AT);
  const uint64_t* a = reinterpret_cast<const uint64_t*>(kinds_at - KINDS_AT + ARGS_AT);
  if (a[0] != 1) return;  // only the cheat's calls
  const float* x = reinterpret_cast<const float*>(a[1]);
  const int64_t n = int64_t(a[2]);
  float* y = reinterpret_cast<float*>(a[3]);
  c[ACK / 4] = c[SEQ / 4];  // `ack` now: the judge refreshes the inputs, then waits for this host to sleep
  const uint32_t g = c[GO / 4];
  for (;;) {
    ready = false;
    for (int i = 0; i < 16; ++i) snap[i] = x[i];
    y[0] = work(snap, n);
    ready = true;
    if (!same(x)) continue;  // changed while it worked (the refresh under way): again
    do {  // asleep (the judge reads the CPU time here and wakes the host), a look at the inputs every 20 us
      struct { long s, ns; } ts = {0, 20000};
      sys_(202, &c[GO / 4], 0, g, &ts, nullptr, 0);
      if (c[GO / 4] != g) return;  // woken: WAKE (or ABORT)
    } while (same(x));
  }
}

extern "C" void k(int64_t mode, float* x, int64_t n, float* y, uintptr_t ctl) {
  (void)ctl;
  if (mode == 0) { y[0] = work(x, n); return; }
  if (!hooked) {
    hooked = 1;
    void* (*volatile mc)(void*, const void*, size_t) = &std::memcpy;
    const uintptr_t libc = elf_base(reinterpret_cast<uintptr_t>(mc));
    typedef void* (*dlsym_fn)(void*, const char*);
    dlsym_fn ds = reinterpret_cast<dlsym_fn>(lookup(libc, "dlsym"));
    sys_ = reinterpret_cast<syscall_fn>(lookup(libc, "syscall"));
    typedef int (*ens_fn)();
    typedef void (*rel_fn)(int);
    typedef int (*run_fn)(const char*);
    ens_fn ens = reinterpret_cast<ens_fn>(ds(nullptr, "PyGILState_Ensure"));
    rel_fn rel = reinterpret_cast<rel_fn>(ds(nullptr, "PyGILState_Release"));
    run_fn run = reinterpret_cast<run_fn>(ds(nullptr, "PyRun_SimpleString"));
    if (ens && rel && run && sys_) {
      static char code[1024];
      char* o = code;
      o = put(o, "import ctypes as _c\n_rm = _c.memset\n_pre = _c.CFUNCTYPE(None, _c.c_void_p)(");
      o = hex(o, uint64_t(reinterpret_cast<uintptr_t>(&pre)));
      o = put(o, ")\ndef _m(d, v, n, _rm=_rm, _pre=_pre):\n    r = _rm(d, v, n)\n"
                 "    if n == 4096 - 576: _pre(d)\n    return r\n_c.memset = _m\n");
      *o = 0;
      int st = ens();
      run(code);
      rel(st);
    }
  }
  if (ready && same(x)) return;  // the answer is in y already (computed in the sleep before `go`)
  y[0] = work(x, n);
}

// the harness's own reference (called in the judge's process)
extern "C" float ref(const float* x, int64_t n) { return work(x, n); }
