"""Confined agent for a pool run (`pipe run --workers 2`): during its own call it watches the
judge's kernel hosts (/proc/PID/stat of the worker's children `kernel_host.py`: readable, state
R/S) and burns CPU on the worker's core (sched_setaffinity on itself is allowed) only while the
incumbent's host runs. argv: RUN SPEC TEMPLATE WORKDIR MODE(attack|control) STAY_S CALLS.
Call 1 (history empty; the start configuration is being timed): burn whenever a host runs.
Later calls: a re-timing request starts one host per job and shape, in the order (candidate,
incumbent) per shape (Runtime.load; every host ends with the request): the incumbent's is the
second, fourth, ... by pid: burn only while it runs."""
import json, mmap, os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s42-jail"))
import agentlib

ctx = agentlib.context()
work, mode, stay, calls = sys.argv[4], sys.argv[5], float(sys.argv[6]), int(sys.argv[7])
log = open(os.path.join(work, "target.log"), "a")
stf = os.path.join(work, "state.json")
st = json.load(open(stf)) if os.path.exists(stf) else {"calls": 0, "next": 0}
st["calls"] += 1
PLAN = [{"ACC": 1, "THREADS": 1, "UNROLL": 2}, {"ACC": 1, "THREADS": 1, "UNROLL": 4},
        {"ACC": 2, "THREADS": 1, "UNROLL": 1}, {"ACC": 4, "THREADS": 1, "UNROLL": 1},
        {"ACC": 8, "THREADS": 1, "UNROLL": 1}, {"ACC": 2, "THREADS": 1, "UNROLL": 2}]


def procs():
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                kids.setdefault(agentlib.ppid_of(int(p)), []).append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    tramp = os.getppid(); driver = agentlib.ppid_of(tramp)
    workers = [k for k in kids.get(driver, []) if "spawn_main" in agentlib.comm(k)]
    return {w: sorted(h for h in kids.get(w, []) if "kernel_host" in agentlib.comm(h)) for w in workers}


def cpus(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("Cpus_allowed_list"):
            s = l.split(":")[1].strip()
            out = set()
            for part in s.split(","):
                a, _, b = part.partition("-")
                out |= set(range(int(a), int(b or a) + 1))
            return out


first = len(ctx["history"]["recent"]) == 0
burned = 0.0
if st["calls"] <= calls:
    flag = mmap.mmap(-1, 8)
    t_end = time.time() + stay
    tree = {}
    seen_at = None
    rt = {}
    burner = None
    ncpu = os.cpu_count()
    on_since, samples, hits = None, 0, 0
    targets, tcpu = {}, None
    seen_hosts, maxhosts, burn_s = {}, 0, 0.0
    last_scan = 0
    last_t = time.time()
    t_start = time.time()
    while time.time() < t_end:
        # stay only while there is something to perturb: a re-timing (a worker with 2+ hosts),
        # or in call 1 the start configuration's timing; otherwise answer at once
        if time.time() - t_start > 1.5 and maxhosts < (1 if first else 2):
            break
        if maxhosts >= (1 if first else 2) and seen_at and time.time() - seen_at > 3.0:
            break  # a re-timing lasts about 2 s
        if maxhosts >= (1 if first else 2) and not seen_at:
            seen_at = time.time()
        if time.time() - last_scan > 0.02:  # rescan the tree
            last_scan = time.time()
            tree = procs()
            targets = {}
            seen_hosts.update({str(h): w for w, hs in tree.items() for h in hs})
            maxhosts = max([maxhosts] + [len(hs) for hs in tree.values()])
            for w, hosts in tree.items():
                pick = hosts if first else hosts[1::2]  # call 1: all; a re-timing loads (candidate, incumbent) per shape: the 2nd, 4th, ...
                for h in pick:
                    try:
                        targets[h] = os.open(f"/proc/{h}/schedstat", os.O_RDONLY) if h not in targets else targets[h]
                        tcpu = cpus(h)
                    except OSError:
                        pass
            if tcpu and burner is None and mode == "attack":
                burner = os.fork()
                if burner == 0:
                    os.sched_setaffinity(0, tcpu)
                    while time.time() < t_end and flag[1] == 0:
                        if flag[0]:
                            x = 0
                            for i in range(2000):
                                x += i
                        else:
                            time.sleep(0.00005)
                    os._exit(0)
                other = set(range(ncpu)) - tcpu
                if other:
                    os.sched_setaffinity(0, other)
        running = False
        for h, fd in list(targets.items()):
            try:
                v = int(os.pread(fd, 64, 0).split()[0])
                now = time.time()
                if rt.get(h, (v, 0))[0] != v:
                    rt[h] = (v, now)
                elif h not in rt:
                    rt[h] = (v, 0)
                if now - rt[h][1] < 0.003:  # its CPU time grew in the last 3 ms: its job is being timed
                    running = True
            except (OSError, IndexError):
                targets.pop(h, None)
        samples += 1; hits += running
        now = time.time()
        if flag[0]:
            burn_s += now - last_t
        last_t = now
        flag[0] = 1 if (running and mode == "attack") else 0
        time.sleep(0.00005)
    flag[0] = 0
    flag[1] = 1
    if burner:
        os.waitpid(burner, 0)
    log.write(json.dumps({"call": st["calls"], "first": first, "mode": mode, "samples": samples,
                          "incumbent_running_frac": round(hits / max(1, samples), 3), "tree": procs(), "hosts_seen": seen_hosts, "max_hosts_at_once": maxhosts, "burn_s": round(burn_s, 3)}) + "\n")
tried = {json.dumps(t["params"], sort_keys=True) for t in ctx["history"]["recent"]}
props = []
while st["next"] < len(PLAN) and len(props) < max(1, ctx.get("want", 1)) and len(props) < 1:
    p = PLAN[st["next"]]; st["next"] += 1
    if json.dumps(p, sort_keys=True) not in tried:
        props.append({"params": p, "note": f"{mode} call {st['calls']}"})
json.dump(st, open(stf, "w"))
print(json.dumps({"proposals": props}))
