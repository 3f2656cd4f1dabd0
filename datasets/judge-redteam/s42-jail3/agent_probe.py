"""Confined agent (pool run): what it can see of the judge's processes. Writes probe.log in its
workdir (argv[4]); answers one untried configuration per call."""
import json, os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s42-jail"))
import agentlib

ctx = agentlib.context()
out = open(os.path.join(sys.argv[4], "probe.log"), "a")
tramp, driver, others = agentlib.tree()
FILES = ["stat", "schedstat", "status", "wchan", "io", "syscall", "stack", "maps", "environ", "cmdline",
         "sched", "cpuset", "cgroup", "oom_score", "oom_score_adj", "limits", "fdinfo/0", "fd", "task",
         "timerslack_ns", "mem", "personality", "attr/current", "numa_maps", "smaps_rollup", "pagemap",
         "timers", "mountinfo", "loginuid", "autogroup", "comm", "exe", "cwd", "root"]
rep = {"self_pid": os.getpid(), "tramp": tramp, "driver": driver, "n_calls": len(ctx["history"]["recent"])}
for pid in [driver] + others:
    r = {"cmd": agentlib.comm(pid)}
    for f in FILES:
        p = f"/proc/{pid}/{f}"
        try:
            if f in ("fd", "task"):
                v = os.listdir(p)
            elif f in ("exe", "cwd", "root"):
                v = os.readlink(p)
            else:
                with open(p, "rb") as fh:
                    v = fh.read(300).decode(errors="replace")
            r[f] = v if f in ("stat", "schedstat", "wchan", "io", "cpuset", "oom_score", "oom_score_adj",
                              "syscall", "sched", "autogroup", "task", "fd", "exe", "cwd", "timerslack_ns") else "OK"
            if f == "status":
                r["status"] = {l.split(":")[0]: l.split(":", 1)[1].strip() for l in v.splitlines()
                               if l.split(":")[0] in ("State", "Cpus_allowed_list", "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches", "VmRSS")}
        except OSError as e:
            r[f] = f"ERR {e.errno}"
    rep[str(pid)] = r
out.write(json.dumps(rep) + "\n")
print(agentlib.answer(ctx, {"probed": len(others)}))
