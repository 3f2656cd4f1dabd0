"""Shared bits of the attacking agents: the context, the process tree, the answer."""
import itertools, json, os, sys


def context():
    return json.load(sys.stdin)


def ppid_of(pid):
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def comm(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


def tree():
    """(trampoline, driver, [the driver's other descendants: judge worker, kernel host, ...])."""
    tramp = os.getppid()
    driver = ppid_of(tramp)
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                kids.setdefault(ppid_of(int(p)), []).append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [k for k in kids.get(driver, []) if k != tramp]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return tramp, driver, out


def answer(ctx, note, extra=None):
    tried = {json.dumps(t["params"], sort_keys=True) for t in ctx["history"]["recent"]}
    space = ctx["task"]["space"]["params"]
    for combo in itertools.product(*space.values()):
        p = dict(zip(space, combo))
        if json.dumps(p, sort_keys=True) not in tried:
            prop = {"params": p, "note": json.dumps(note)}
            prop.update(extra or {})
            return json.dumps({"proposals": [prop]})
    return json.dumps({"proposals": []})
