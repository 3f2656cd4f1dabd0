#!/bin/sh
# E2b: the agent SIGKILLs its trampoline; a helper it forked outlives the call.
cd /work/main && . .venv/bin/activate
W=/tmp/s42-jail/killtramp; rm -rf $W; mkdir -p $W
PIPE_AGENT_WORKDIR=$W python -I -S runner/search/agents/confine.py "{\"writable\":[\"$W\"],\"ports\":[443],\"timeout_s\":30}" -- \
  python datasets/judge-redteam/s42-jail/agent_killtramp.py 6
echo "trampoline exit: $?"; sleep 1
cat $W/survivor.pid; P=$(cut -d' ' -f1 $W/survivor.pid)
ps -o pid,ppid,stat,cmd -p $P || echo "helper gone"
