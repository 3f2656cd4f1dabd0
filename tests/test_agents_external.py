"""Context-reading agents through `pipe run` on the CPU pipeline: a language model
behind a local chat-completions server, and a command agent. Malformed,
out-of-space and forbidden replies and a variant that fails to compile are all
recorded, and the run completes. Plus `pipe eval` sharing a run folder with
`pipe run`. The commands go through the CLI's entry in the test's process
(conftest.pipe_main); each run's judge is a worker process of its own."""

import json
import sqlite3
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml

from runner.search.agents import confine

from .conftest import FEW_ROWS, PIPELINES, ROOT, pipe_main

pytestmark = pytest.mark.slow

BASE = yaml.safe_load((PIPELINES / "rmsnorm-cpu.yaml").read_text())
TEMPLATE = (ROOT / "kernel_templates" / "rmsnorm.cpp.j2").read_text()


def spec_with_agent(project, agent: dict, trials: int) -> str:
    d = json.loads(json.dumps(BASE))
    d["name"] = "rmsnorm-agent"
    d["agent"] = agent
    d["goal"] = {"budget": {"trials": trials}}
    d["runtime"]["rep_ms"] = 10
    d["baseline"] = "none"
    d["op"]["shapes"] = FEW_ROWS
    p = project / "pipelines" / "agent.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return str(p)


def own_folder(project) -> dict:
    """A command agent's options for a folder of its own (its working folder, where it keeps its
    state): confined where the kernel can (search/agents/confine.py; test_agent_confinement.py
    checks the confinement and, where the kernel cannot, the refusal)."""
    return {"workdir": str(project / "agent"), **({} if confine.unavailable() is None else {"confine": False})}


def reply(obj) -> str:
    return obj if isinstance(obj, str) else json.dumps(obj)


GOOD_VARIANT = TEMPLATE.replace("// RMSNorm over rows on the CPU", "// A variant: RMSNorm over rows on the CPU")
SCRIPT = [
    "I think ACC should be 8, it feels right.",  # malformed
    {"proposals": [{"params": {"ACC": 3, "THREADS": 1, "UNROLL": 1}}]},  # out of space
    {"proposals": [{"params": {"ACC": 8, "THREADS": 1, "UNROLL": 2}, "note": "wider partial sums"}]},
    {"proposals": [{"params": {"ACC": 8, "THREADS": 1, "UNROLL": 1},
                    "variant": TEMPLATE.replace("#include <thread>", '#include <thread>\n#pragma GCC optimize("fast-math")')}]},
    {"proposals": [{"params": {"ACC": 16, "THREADS": 1, "UNROLL": 1},
                    "variant": TEMPLATE.replace("float eps) {", "float eps) { this is not C++")}]},
    "```json\n" + json.dumps({"proposals": [{"params": {"ACC": 16, "THREADS": 1, "UNROLL": 2},
                                             "variant": GOOD_VARIANT, "note": "same kernel, new comment"}]}) + "\n```",
]


class ChatServer:
    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                if not outer.script:
                    self.send_response(503)
                    self.end_headers()
                    return
                content = reply(outer.script.pop(0))
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = HTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_llm_agent_end_to_end(project):
    srv = ChatServer(SCRIPT)
    try:
        spec = spec_with_agent(project, {"strategy": "llm", "seed": 1, "options": {
            "base_url": srv.url, "model": "test-model", "api_key_env": "PIPE_TEST_KEY", "timeout_s": 10,
            "max_retries": 2}}, trials=7)
        run_dir = project / "run"
        r = pipe_main("run", spec, "--run-dir", str(run_dir), cwd=project, env={"PIPE_TEST_KEY": "sekrit-123"})
    finally:
        srv.close()
    assert r.returncode == 1, r.stderr  # no target: the budget ends it
    db = sqlite3.connect(run_dir / "ledger.db")
    trials = db.execute("SELECT id, params, status, reason, variant, agent FROM trials ORDER BY id").fetchall()
    assert len(trials) == 7
    by = [(json.loads(p), st, v) for _, p, st, _, v, _ in trials]
    assert by[0][0] == BASE["search"]["start"] and by[0][1] == "ok"  # the start config first
    assert by[1] == ({"ACC": 8, "THREADS": 1, "UNROLL": 2}, "ok", None)
    assert by[2][1] == "forbidden" and by[2][2] is not None  # a variant with a fast-math pragma
    assert by[3][1] == "compile_error" and by[3][2] is not None
    assert by[4][1] == "ok" and by[4][2] is not None  # a variant that works
    # the server ran dry: failed calls are recorded and random candidates keep the run going
    replies = db.execute("SELECT outcome, reply, feedback FROM replies ORDER BY id").fetchall()
    outcomes = [o for o, _, _ in replies]
    assert outcomes[:2] == ["malformed", "out_of_space"]
    assert outcomes.count("ok") == 4 and "fallback" in outcomes and "error" in outcomes
    assert "ACC=3 is not one of" in replies[1][2]
    assert "I think ACC should be 8" in replies[0][1]
    variants = db.execute("SELECT id, parent, diff FROM variants").fetchall()
    assert len(variants) == 3 and all(p == "template" and d.startswith("---") for _, p, d in variants)
    # the model saw feedback about its bad replies, the forbidden actions verbatim and the history
    ctx = json.loads(srv.requests[1]["body"]["messages"][1]["content"])
    assert "reply is not a JSON object" in ctx["feedback"] or "not usable" in json.dumps(srv.requests[1]["body"])
    later = json.loads(srv.requests[-1]["body"]["messages"][1]["content"])
    assert later["task"]["forbidden"] == BASE["forbidden"]
    assert any(t["status"] == "forbidden" for t in later["history"]["recent"])
    # and each timed trial's time on every shape (the spec has two), not only the mean
    timed = [t for t in later["history"]["recent"] if t["status"] == "ok"]
    assert timed and all(len(t["shape_times_us"]) == 2 and min(t["shape_times_us"]) > 0 for t in timed)
    assert later["task"]["hardware"]["notes"].startswith("#")
    # the key went to the server, never into the run folder or the output
    assert srv.requests[0]["auth"] == "Bearer sekrit-123"
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert b"sekrit-123" not in f.read_bytes(), f
    assert "sekrit-123" not in r.stdout + r.stderr


AGENT_SCRIPT = r'''
import json, os, sys, pathlib
ctx = json.load(sys.stdin)
state = pathlib.Path(os.environ.get("PIPE_AGENT_WORKDIR", ".")) / sys.argv[1]  # its own folder
n = int(state.read_text()) if state.exists() else 0
state.write_text(str(n + 1))
if n == 0:
    print("not json at all")
    sys.exit(0)
if n == 1:
    sys.exit(3)
tried = {json.dumps(t["params"], sort_keys=True) for t in ctx["history"]["recent"]}
space = ctx["task"]["space"]["params"]
import itertools
for combo in itertools.product(*space.values()):
    p = dict(zip(space, combo))
    if json.dumps(p, sort_keys=True) not in tried:
        print(json.dumps({"proposals": [{"params": p, "note": "first untried in grid order"}]}))
        break
'''


def test_command_agent_end_to_end(project):
    script = project / "agent.py"
    script.write_text(AGENT_SCRIPT)
    spec = spec_with_agent(project, {"strategy": "command", "options": {
        "command": [sys.executable, str(script), "state"], "timeout_s": 30, **own_folder(project)}}, trials=4)
    run_dir = project / "run"
    r = pipe_main("run", spec, "--run-dir", str(run_dir), cwd=project)
    assert r.returncode == 1, r.stderr
    db = sqlite3.connect(run_dir / "ledger.db")
    statuses = [s for (s,) in db.execute("SELECT status FROM trials")]
    assert statuses == ["ok"] * 4
    outcomes = [o for (o,) in db.execute("SELECT outcome FROM replies ORDER BY id")]
    # the confinement first, as the run set it up (search/agents/confine.py), then the replies
    assert outcomes.pop(0) == ("confined" if confine.unavailable() is None else "unconfined")
    assert outcomes[:3] == ["malformed", "error", "ok"]
    assert outcomes.count("ok") == 3
    agents = [a for (a,) in db.execute("SELECT agent FROM trials ORDER BY id")]
    assert agents[1:] == ["command"] * 3


def test_hybrid_hands_over_to_a_builtin_strategy(project):
    script = project / "agent.py"
    script.write_text(AGENT_SCRIPT.replace("if n == 0:", "if n < 0:").replace("if n == 1:", "if n < 0:"))
    spec = spec_with_agent(project, {"strategy": "command", "seed": 3, "options": {
        "command": [sys.executable, str(script), "state"], "seed_trials": 3, "then": "random",
        **own_folder(project)}},
        trials=6)
    r = pipe_main("run", spec, "--run-dir", str(project / "run"), cwd=project)
    assert r.returncode == 1, r.stderr
    db = sqlite3.connect(project / "run" / "ledger.db")
    notes = [json.loads(d).get("note") for (d,) in db.execute("SELECT details FROM trials ORDER BY id")]
    assert notes[1:3] == ["first untried in grid order"] * 2  # the command agent seeds
    assert notes[3:] == [None] * 3  # then random search continues
    assert int((project / "agent" / "state").read_text()) == 2  # and the command is not asked again


def test_eval_and_run_share_a_run_folder(project):
    spec = spec_with_agent(project, {"strategy": "random", "seed": 0}, trials=5)
    run_dir = project / "run"
    r1 = pipe_main("eval", spec, "--params", '{"ACC": 16, "THREADS": 1, "UNROLL": 4}', "--run-dir", str(run_dir),
                   "--json", cwd=project)
    assert r1.returncode == 0, r1.stderr
    v = json.loads(r1.stdout)
    assert v["status"] == "ok" and v["trial"] == 1 and v["kept"] and len(v["shapes"]) == 2
    bad = project / "bad.cpp.j2"
    bad.write_text(TEMPLATE.replace("acc[j] += xr[i + j] * xr[i + j];", "acc[j] += xr[i + j];"))
    r2 = pipe_main("eval", spec, "--params", '{"ACC": 4}', "--variant", str(bad), "--run-dir", str(run_dir), "--json",
                   cwd=project)
    assert r2.returncode == 1
    v2 = json.loads(r2.stdout)
    assert v2["status"] == "wrong" and v2["variant"] and "output 'out'" in v2["reason"]
    r3 = pipe_main("run", spec, "--run-dir", str(run_dir), cwd=project)
    assert r3.returncode == 1, r3.stderr
    db = sqlite3.connect(run_dir / "ledger.db")
    rows = db.execute("SELECT id, agent, params_key FROM trials ORDER BY id").fetchall()
    assert [a for _, a, _ in rows[:2]] == ["eval", "eval"] and len(rows) == 5
    assert len({k for _, _, k in rows}) == 5
    # the same candidate again is not judged twice
    r4 = pipe_main("eval", spec, "--params", '{"ACC": 16, "THREADS": 1, "UNROLL": 4}', "--run-dir", str(run_dir),
                   "--json", cwd=project)
    assert json.loads(r4.stdout)["already_judged"] is True
    assert db.execute("SELECT count(*) FROM trials").fetchone()[0] == 5
