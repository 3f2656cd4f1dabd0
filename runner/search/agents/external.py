"""Agents that think outside the runner: a language model over the
OpenAI-compatible chat-completions API, or any executable (a headless coding
agent, a script) that reads the context as JSON on stdin and prints proposals
as JSON on stdout.

Both see the same context: the hardware profile's notes, the op and its notes,
the forbidden actions verbatim, the search space, the template, the goal, the
budget left and a compact history (best so far, recent trials with status and
reason). Both answer in one format:

    {"proposals": [{"params": {...}, "variant": "optional whole template text",
                    "parent": "optional variant id it derives from", "note": "why"}]}

Every reply is validated against the space; a malformed or out-of-space reply
is recorded, returned as feedback and retried a bounded number of times, then
the agent falls back to a seeded random candidate so the run goes on. Calls
have timeouts. The API key is read from the environment variable the spec
names and never logged. Hybrid mode (`options.then`): after `seed_trials`
trials, a built-in strategy continues from everything the history holds.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import signal
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from ...core.errors import PipeError
from ...core.records import trial_key, variant_id
from . import confine
from ..space import Space
from . import Option, Proposal, Seen, make_agent, register

SYSTEM = (
    "You tune GPU kernels for pipe. A human wrote the kernel's structure as a Jinja template; you choose "
    "parameter values (and may propose a whole new template text as a variant). A judge you cannot influence "
    "verifies and times every candidate: forbidden actions, wrong results and impossible times are rejected "
    "and shown to you as status and reason. A variant is verified beside the approved template at the same "
    "parameters on the same inputs, and rejected where its results are less exact. Reply with JSON only, in the "
    "reply_format given."
)
MAX_VARIANT = 200_000


class _External:
    wants_brief = True
    pure = False
    replayable = False  # it asks an outside process or service
    max_retries = 3
    OPTIONS = {"max_retries": Option(3, int), "history": Option(20, int), "seed_trials": Option(None, int),
               "then": Option(None, strategy=True), "then_options": Option(None)}

    def __init__(self, space: Space, seed: int, options: dict, brief: dict | None = None):
        self.space = space
        self.seed = seed
        self.options = options
        self.brief = brief or {}
        self.events: list[dict] = []
        self.max_retries = int(options.get("max_retries", self.max_retries))
        self.history_limit = int(options.get("history", 20))
        self.seed_trials = options.get("seed_trials")
        self.then = options.get("then")
        self._then_agent = None

    # -- context --------------------------------------------------------------------------------
    def context(self, history: Sequence[Seen], n: int, feedback: str = "") -> dict:
        ok = [h for h in history if h.status == "ok" and h.objective]
        best = min(ok, key=lambda h: h.objective) if ok else None
        counts: dict[str, int] = {}
        for h in history:
            counts[h.status] = counts.get(h.status, 0) + 1

        def row(h: Seen) -> dict:
            return {"params": dict(h.params), "variant": h.variant, "status": h.status,
                    "reason": (h.reason or "")[:300],
                    "time_us": round(h.objective * 1e6, 3) if h.objective else None, "metric": h.metric,
                    "shape_times_us": [round(x * 1e6, 3) for x in h.times] if h.times else None}

        budget = self.brief.get("budget", {})
        left = (budget.get("trials") - len(history)) if budget.get("trials") else None
        return {
            "task": self.brief,
            "budget_left": {"trials": left},
            "history": {"trials": len(history), "by_status": counts, "best": row(best) if best else None,
                        "recent": [row(h) for h in history[-self.history_limit:]]},
            "want": n,
            "feedback": feedback,
            "reply_format": {"proposals": [{"params": {p.name: p.values[0] for p in self.space.params},
                                            "variant": None, "parent": None, "note": "why this candidate"}]},
        }

    # -- the exchange ---------------------------------------------------------------------------
    def ask(self, context: dict, transcript: list[dict]) -> str:
        raise NotImplementedError

    def propose(self, history: Sequence[Seen], n: int) -> list[Proposal]:
        if self.then and self.seed_trials is not None and len(history) >= int(self.seed_trials):
            if self._then_agent is None:
                self._then_agent = make_agent(self.then, self.space, self.seed, self.options.get("then_options", {}))
            return self._then_agent.propose(history, n)
        tried = {_key(h.params, h.variant) for h in history}
        feedback, transcript = "", []
        for attempt in range(self.max_retries + 1):
            ctx = self.context(history, n, feedback)
            try:
                reply = self.ask(ctx, transcript)
            except TimeoutError as e:
                self._event("timeout", "", str(e))
                feedback = f"your last reply timed out ({e})"
                continue
            except AgentCallError as e:
                self._event("error", "", str(e))
                feedback = f"your last reply failed: {e}"
                continue
            props, problems = self.validate(reply, tried)
            if props:
                self._event("ok" if not problems else "partial", reply, "; ".join(problems))
                return props[:n]
            feedback = "; ".join(problems) or "no proposals in the reply"
            self._event("malformed" if any(p.startswith("reply") for p in problems) else "out_of_space",
                        reply, feedback)
            transcript += [{"role": "assistant", "content": reply},
                           {"role": "user", "content": f"That reply was not usable: {feedback}. "
                                                       "Answer again with JSON in the reply_format."}]
        fb = self._fallback(history, tried)
        self._event("fallback", "", f"no usable reply after {self.max_retries + 1} tries; a random candidate instead")
        return fb

    def validate(self, reply: str, tried: set) -> tuple[list[Proposal], list[str]]:
        data = _json_in(reply)
        if not isinstance(data, dict) or not isinstance(data.get("proposals"), list):
            return [], ["reply is not a JSON object with a 'proposals' list"]
        out, problems = [], []
        for i, p in enumerate(data["proposals"]):
            if not isinstance(p, dict) or not isinstance(p.get("params"), dict):
                problems.append(f"reply proposal {i} has no 'params' object")
                continue
            params = p["params"]
            why = self.space.contains(params)
            if why:
                problems.append(f"proposal {i} is outside the search space: {why}")
                continue
            variant = p.get("variant")
            if variant is not None and (not isinstance(variant, str) or not variant.strip() or len(variant) > MAX_VARIANT):
                problems.append(f"proposal {i}: 'variant' must be the whole template text (under {MAX_VARIANT} chars)")
                continue
            vid = variant_id(variant) if variant else None
            if _key(params, vid) in tried:
                problems.append(f"proposal {i} was already tried: {json.dumps(params, sort_keys=True)}")
                continue
            parent = p.get("parent") if isinstance(p.get("parent"), str) else None
            out.append(Proposal(dict(params), variant, parent, str(p.get("note", ""))[:2000]))
        return out, problems

    def _fallback(self, history, tried) -> list[Proposal]:
        rng = random.Random(self.seed * 7919 + len(history))
        for _ in range(500):
            cfg = self.space.sample(rng, tries=50)
            if cfg is not None and _key(cfg, None) not in tried:
                return [Proposal(cfg, note="fallback: random")]
        rest = [c for c in self.space if _key(c, None) not in tried]
        return [Proposal(rest[0], note="fallback: first untried")] if rest else []

    def _event(self, outcome: str, reply: str, feedback: str) -> None:
        self.events.append({"agent": self.name, "outcome": outcome, "reply": reply, "feedback": feedback})

    def drain(self) -> list[dict]:
        out, self.events = self.events, []
        return out


class AgentCallError(Exception):
    pass


@register("llm")
class LanguageModel(_External):
    """options: base_url, model, api_key_env, temperature, timeout_s, max_retries, history,
    seed_trials + then (hybrid). PIPE_LLM_BASE_URL, PIPE_LLM_MODEL, PIPE_LLM_API_KEY_ENV fill gaps."""

    OPTIONS = {**_External.OPTIONS, "base_url": Option(required=True, env="PIPE_LLM_BASE_URL"),
               "model": Option(required=True, env="PIPE_LLM_MODEL"), "api_key_env": Option(None),
               "timeout_s": Option(120, float), "temperature": Option(0.2, float)}

    def __init__(self, space, seed, options, brief=None):
        super().__init__(space, seed, options, brief)
        self.base_url = (options.get("base_url") or os.environ.get("PIPE_LLM_BASE_URL") or "").rstrip("/")
        self.model = options.get("model") or os.environ.get("PIPE_LLM_MODEL") or ""
        self.key_env = options.get("api_key_env") or os.environ.get("PIPE_LLM_API_KEY_ENV") or "OPENAI_API_KEY"
        self.timeout = float(options.get("timeout_s", 120))
        self.temperature = float(options.get("temperature", 0.2))
        if not self.base_url or not self.model:
            raise ValueError("the llm agent needs options.base_url and options.model "
                             "(or PIPE_LLM_BASE_URL and PIPE_LLM_MODEL)")

    def ask(self, context: dict, transcript: list[dict]) -> str:
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": json.dumps(context, default=str)}] + transcript
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "seed": self.seed}).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                data = json.loads(r.read().decode("utf-8", "replace"))
        except (TimeoutError, urllib.error.URLError) as e:
            if isinstance(e, TimeoutError) or "timed out" in str(e):
                raise TimeoutError(f"no answer within {self.timeout:g} s") from None
            raise AgentCallError(_scrub(f"HTTP call failed: {e}", key)) from None
        except (ValueError, OSError, http.client.HTTPException) as e:
            raise AgentCallError(_scrub(f"unreadable answer: {type(e).__name__}: {e}", key)) from None
        try:
            return str(data["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError):
            raise AgentCallError("answer has no choices[0].message.content") from None


@register("command")
class Command(_External):
    """options: command (a string or a list), timeout_s, max_retries, history, seed_trials + then;
    confine (default true), workdir, writable, connect_ports: the confinement (agents/confine.py)."""

    OPTIONS = {**_External.OPTIONS, "command": Option(required=True, hint="a string or a list"),
               "timeout_s": Option(300, float), "confine": Option(True, choices=(True, False)),
               "workdir": Option(None), "writable": Option(None), "connect_ports": Option(None)}

    def __init__(self, space, seed, options, brief=None):
        super().__init__(space, seed, options, brief)
        cmd = options.get("command")
        if not cmd:
            raise ValueError("the command agent needs options.command")
        self.argv = shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]
        self.timeout = float(options.get("timeout_s", 300))
        self.confined = options.get("confine", True) is not False
        self.jail: dict | None = None  # the trampoline's config once prepared (None: unconfined)
        self.workdir: Path | None = None  # its own folder once prepared

    @property
    def exclusive(self) -> bool:
        """Whether the loop must ask it only while no judge worker is timing (loop._run_pool):
        while its own process answers, until a hybrid's built-in strategy takes over."""
        return self._then_agent is None

    def prepare(self, owned: list[tuple[Path, str]]) -> str:
        """Sets the agent's folder and its confinement up against what the runner owns (`owned`:
        (path, what) pairs, the run folder among them), records the confinement among its
        events and returns its description; AgentConfinementError where it cannot be had or an
        option asks for what the runner owns."""
        why = confine.unavailable() if self.confined else None
        if why:
            raise AgentConfinementError(
                f"agent.options.confine: {why}, so the command agent cannot be kept from the run folder, the "
                "judge's code and processes. Run it on a newer kernel, or set `confine: false` under "
                "agent.options to run it unconfined (the run records that)")
        opt = self.options
        wd = opt.get("workdir")
        if wd:
            work = Path(str(wd)).expanduser().resolve()
            clash = confine.clash(work, owned) or confine.unsafe(work)
            if clash:
                raise AgentConfinementError(f"agent.options.workdir: {work} {clash}")
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(tempfile.mkdtemp(prefix="pipe-agent-"))
            atexit.register(shutil.rmtree, work, True)
        (work / "tmp").mkdir(exist_ok=True)
        self.workdir = work
        said = self._confine(opt, work, owned)
        self._event("confined" if self.jail else "unconfined", "", said)  # the record's, once
        return said

    def _confine(self, opt: dict, work: Path, owned) -> str:
        """The trampoline's config (self.jail; None unconfined) and its description."""
        if not self.confined:
            self.jail = None
            return ("UNCONFINED (agent.options.confine: false): the command could write the run folder, "
                    "the judge's code and the compile cache, and signal the judge's processes")
        writable = [work]
        for i, w in enumerate(opt.get("writable") or []):
            p = Path(str(w)).expanduser().resolve()
            clash = confine.clash(p, owned) or confine.unsafe(p)
            if clash:
                raise AgentConfinementError(f"agent.options.writable[{i}]: {p} {clash}")
            if not p.is_dir():
                raise AgentConfinementError(f"agent.options.writable[{i}]: {p} is not a folder")
            writable.append(p)
        why = confine.nested(writable)
        if why:
            raise AgentConfinementError(f"agent.options.writable: {why}")
        ports = opt.get("connect_ports")
        ports = None if ports == "any" else list(confine.DEFAULT_PORTS if ports is None else ports)
        folders = []
        for w in writable:  # each folder as it is now: the trampoline refuses one swapped later
            st = w.stat()
            folders.append({"path": str(w), "dev": st.st_dev, "ino": st.st_ino})
        self.jail = {"writable": folders, "workdir": str(work), "ports": ports, "timeout_s": self.timeout,
                     "abi": confine.abi()}
        return (f"confined (Landlock ABI {self.jail['abi']}): writes only to {', '.join(map(str, writable))} "
                f"and /dev/null; TCP to {'any port' if ports is None else 'ports ' + ', '.join(map(str, ports))}; "
                "no capability, no unix socket; no signal, trace or scheduling of other processes; "
                "none left running after a reply")

    def ask(self, context: dict, transcript: list[dict]) -> str:
        payload = dict(context, transcript=transcript)
        if self.workdir is None:  # made outside a run (loop.run prepares it first)
            self.prepare(confine.owned_paths(None, None))
        # its folder: PIPE_AGENT_WORKDIR (the working folder stays the user's, so that a relative
        # path in `command` means what it did; confined, the agent may read it, not write it)
        env = dict(os.environ, PIPE_AGENT_WORKDIR=str(self.workdir), TMPDIR=str(self.workdir / "tmp"))
        argv, wait = self.argv, self.timeout
        if self.jail is not None:  # the trampoline: restricts itself, runs the agent, sweeps its tree
            argv = [sys.executable, "-I", "-S", confine.__file__, json.dumps(self.jail), "--", *self.argv]
            wait = self.timeout + 10  # the trampoline keeps the time; this is the backstop
        try:  # its own process group: on a timeout, the agent and everything it started go
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True, env=env)
        except OSError as e:
            raise AgentCallError(f"cannot run {self.argv[0]}: {e}") from None
        try:
            out, err = p.communicate(json.dumps(payload, default=str), timeout=wait)
        except subprocess.TimeoutExpired:
            # the agent's group (none of its processes can leave it; its leader may be gone, so
            # each child of the trampoline says which it is), then the trampoline's
            groups = [confine.pgid_of(c) for c in confine._children(p.pid)] if self.jail is not None else []
            for g in [*dict.fromkeys(x for x in groups if x and x != os.getpgrp()), p.pid]:
                try:
                    os.killpg(g, signal.SIGKILL)
                except OSError:
                    pass
            p.communicate()
            raise TimeoutError(f"no answer within {self.timeout:g} s") from None
        if self.jail is not None and p.returncode == confine.KILLED_ON_TIMEOUT:
            raise TimeoutError(f"no answer within {self.timeout:g} s")
        if self.jail is not None and p.returncode == confine.CANNOT_CONFINE:
            raise AgentConfinementError(err.strip()[-300:])
        if p.returncode != 0:
            raise AgentCallError(f"exit code {p.returncode}: {err.strip()[-300:]}")
        swept = [ln for ln in err.splitlines() if ln.startswith("pipe: ") and "left running were killed" in ln]
        if swept:  # the record says so: processes an agent leaves are an attempt on the timings
            self._event("swept", "", swept[-1].removeprefix("pipe: "))
        return out


class AgentConfinementError(PipeError):
    """A command agent that cannot be confined as the spec asks."""


def _json_in(text: str) -> Any:
    """The JSON object in a reply: the whole text, a fenced block, or the outermost braces."""
    for candidate in (text, *re.findall(r"```(?:json)?\s*(.*?)```", text, re.S)):
        try:
            return json.loads(candidate)
        except (json.JSONDecodeError, TypeError):
            pass
    a, b = text.find("{"), text.rfind("}")
    if 0 <= a < b:
        try:
            return json.loads(text[a:b + 1])
        except json.JSONDecodeError:
            return None
    return None


def _key(params: dict, variant: str | None) -> str:
    return trial_key(dict(params), variant)


def _scrub(msg: str, key: str | None) -> str:
    return msg.replace(key, "***") if key else msg
