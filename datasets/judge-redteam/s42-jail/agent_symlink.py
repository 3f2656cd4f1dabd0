"""E4 (pipe run, spec-side): a writable folder that holds the agent's workdir. The spec's folders are
checked once (spec.py, Command.prepare: resolved, not clashing with what the runner owns), but the
trampoline opens each configured path again at every call (restrict_self: os.open(path, O_PATH),
which follows symlinks). Call 1 swaps its own workdir (inside the writable folder) for a symlink
to the run folder; from call 2 on, Landlock grants every right on the run folder itself.
argv: run_dir spec template"""
import json, os, sys
from agentlib import answer, context

ctx = context()
run_dir = sys.argv[1]
work = os.environ["PIPE_AGENT_WORKDIR"]
call = len(ctx["history"]["recent"])
note = {"call": call, "workdir": work, "workdir_is_link": os.path.islink(work)}


def t(name, f):
    try:
        f()
        note[name] = "ok"
    except OSError as e:
        note[name] = repr(e)


if call == 1:
    t("swap_workdir_for_symlink", lambda: (os.rename(work, work + ".old"), os.symlink(run_dir, work)))
t("write_run_folder", lambda: open(os.path.join(run_dir, f"forged-{call}.txt"), "w").write("written by the agent\n"))
t("append_trials_tsv", lambda: open(os.path.join(run_dir, "trials.tsv"), "a").write("# the agent was here\n"))
t("append_ledger_db", lambda: open(os.path.join(run_dir, "ledger.db"), "ab").write(b""))
print(answer(ctx, note))
