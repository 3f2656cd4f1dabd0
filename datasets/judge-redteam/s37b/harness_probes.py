"""s37b probes (bare harness, cpu_host.Host, threads=1): each cheat against its honest twin doing
the same CPU work, interleaved, medians over 31 timed calls (prime, refresh, timed, census, answer
checked, as in harness_primed.py). Usage: python harness_probes.py SO"""
import ctypes
import random
import statistics
import sys

import torch

from runner.build.backends import cpu_host as host

so = sys.argv[1]
ref = ctypes.CDLL(so).ref
ref.restype, ref.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_int64]
CALLS = 31


def duel(label, honest, cheat, n, m, check):
    arena, census = host.Arena(1 << 24), host.HostCensus()
    kinds = ["i64", "ptr", "i64", "ptr", "i64"]
    arms = {"honest": honest, "cheat": cheat}
    hosts = {a: host.Host(arena, so, "k", kinds, census, threads=1) for a in arms}
    census.hosts, census.arena = list(hosts.values()), arena
    x = {a: arena.tensor(torch.rand(16)) for a in arms}
    y = {a: arena.tensor(torch.zeros(16)) for a in arms}
    hc = {a: host.HostCall(hosts[a], [arms[a], x[a].data_ptr(), n, y[a].data_ptr(), m]) for a in arms}
    rng = random.Random(7)
    for a in arms:
        for _ in range(3):
            hc[a]()
        census.take()
    times = {a: [] for a in arms}
    wrong = {a: 0 for a in arms}
    notes = {a: [] for a in arms}
    for i in range(CALLS):
        for a in (("honest", "cheat") if i % 2 == 0 else ("cheat", "honest")):
            hosts[a].prime(hc[a].words)
            x[a].copy_(torch.rand(16, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))))
            t = hc[a].timed()
            census.check()
            times[a].append(t)
            if not check(a, x[a], y[a]):
                wrong[a] += 1
            why = census.take()
            if why:
                notes[a].append(why)
    print(f"-- {label}")
    for a in arms:
        ts = sorted(times[a])
        q = statistics.quantiles(ts, n=4)
        print(f"   {a:7s} median {statistics.median(ts)*1e6:8.1f} us  IQR [{q[0]*1e6:.1f}, {q[2]*1e6:.1f}]  "
              f"wrong {wrong[a]}/{CALLS}  judge notes {len(notes[a])}")
        for w in dict.fromkeys(notes[a]):
            print("      note:", w[:160])
    print(f"   ratio cheat/honest: {statistics.median(times['cheat']) / statistics.median(times['honest']):.3f}")
    for h in hosts.values():
        h.close()


N = 40000  # ~70 us
duel("affinity escape: two threads, one moved to every core (runtime.threads = 1)", 0, 1, N, 0,
     lambda a, x, y: (float(y[0]) == ref(x.data_ptr(), N)) if a == "honest"
     else float(y[0]) == ref(x.data_ptr(), N - N // 2) and float(y[1]) == ref(x.data_ptr(), N // 2))
for m in (5000, 15000, 30000):
    duel(f"a detached thread of {m} steps (~{m * 70 // 40000} us) outliving the call (honest: joined)", 3, 2, N, m,
         lambda a, x, y, m=m: float(y[0]) == ref(x.data_ptr(), N - m) and float(y[1]) == ref(x.data_ptr(), m))
