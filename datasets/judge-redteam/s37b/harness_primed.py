"""s37b attack P (work in the primed sleep): the honest kernel and the cheat, each in a kernel host
of its own (cpu_host.Host, threads=1), timed interleaved in the judge's own order: prime (the
host's `ack`), then new input values (the judge's refresh, Judge._bench's hooks), then the timed
call (Host.timed), the census after it (timing.bench's guard), the answer checked after every
call. Usage: python harness_primed.py SO [N_STEPS] [CALLS]"""
import ctypes
import random
import statistics
import sys

import torch

from runner.build.backends import cpu_host as host

so = sys.argv[1]
n_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40000
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 31
ref = ctypes.CDLL(so).ref
ref.restype, ref.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_int64]

arena, census = host.Arena(1 << 24), host.HostCensus()
kinds = ["i64", "ptr", "i64", "ptr", "i64"]
hosts = {m: host.Host(arena, so, "k", kinds, census, threads=1) for m in (0, 1)}
census.hosts, census.arena = list(hosts.values()), arena
rng = random.Random(1)
x = {m: arena.tensor(torch.rand(16)) for m in hosts}
y = {m: arena.tensor(torch.zeros(16)) for m in hosts}
hc = {m: host.HostCall(hosts[m], [m, x[m].data_ptr(), n_steps, y[m].data_ptr(), arena.base + hosts[m].ctl_off])
      for m in hosts}
for m in hosts:  # warm-up, untimed
    for _ in range(3):
        hc[m]()
times = {m: [] for m in hosts}
wrong = {m: 0 for m in hosts}
notes = {m: [] for m in hosts}
cpu_used = {m: 0 for m in hosts}
for i in range(calls):
    for m in ((0, 1) if i % 2 == 0 else (1, 0)):
        h = hosts[m]
        h.prime(hc[m].words)  # the host's `ack` (HostCall.scrub in the judge)
        x[m].copy_(torch.rand(16, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))))  # the refresh
        t = hc[m].timed()
        census.check()
        times[m].append(t)
        cpu_used[m] += h.cpu_bound_used
        want = ref(x[m].data_ptr(), n_steps)
        if float(y[m][0]) != want:
            wrong[m] += 1
        why = census.take()
        if why:
            notes[m].append(why)
for m, name in ((0, "honest"), (1, "cheat (work in the primed sleep)")):
    ts = sorted(times[m])
    q = statistics.quantiles(ts, n=4)
    print(f"{name:34s} median {statistics.median(ts)*1e6:8.1f} us  IQR [{q[0]*1e6:.1f}, {q[2]*1e6:.1f}]  "
          f"min {ts[0]*1e6:.1f}  wrong answers {wrong[m]}/{calls}  judge notes {len(notes[m])}  cpu-bound figure {cpu_used[m]}")
    for w in notes[m][:2]:
        print("    note:", w[:200])
print(f"ratio cheat/honest (medians): {statistics.median(times[1]) / statistics.median(times[0]):.3f}")
for h in hosts.values():
    h.close()
