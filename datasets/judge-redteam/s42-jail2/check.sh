#!/bin/sh
# Reproduces every attempt of s42-jail2 (about 1 minute, 2 cores). Scratch objects only, under
# /tmp/s42-jail2 and /tmp/s42-jail (the s42 harness's projects); the agent always runs confined.
set -u
cd /work/main && . .venv/bin/activate
H=datasets/judge-redteam/s42-jail2
echo "### B battery through the trampoline (persistent IPC, keyring, file_setattr, utime, fscrypt, userns, cgroup, pty, inotify, locks)"
python $H/check_battery.py
echo "### C1 deep chain vs the sweep, trampoline alone (depth 260, survivor burns 3 s)"
rm -rf /tmp/s42-jail2/chain; mkdir -p /tmp/s42-jail2/chain
echo '{}' | sh $H/confined.sh /tmp/s42-jail2/chain python $PWD/$H/agent_deepchain.py 260 3; echo " trampoline rc=$?"
sleep 1; echo "survivors: $(grep -c survived /tmp/s42-jail2/chain/helper.log)"; grep "burning for" /tmp/s42-jail2/chain/helper.log
sleep 3
echo "### C2 deep chain through a real pipe run (3 trials; survivors burn 25 s through the later trials and past the run)"
rm -rf /tmp/s42-jail2/chainwork
python datasets/judge-redteam/s42-jail/harness.py j2_chain $H/agent_deepchain.py --trials 3 \
  --opt 'workdir="/tmp/s42-jail2/chainwork"' --arg 260 --arg 25 | grep -v "^reply event" | head -3
echo "survivors: $(grep -c survived /tmp/s42-jail2/chainwork/helper.log)"; grep -E "exits|burning for" /tmp/s42-jail2/chainwork/helper.log
python -c "
import sqlite3; c = sqlite3.connect('file:/tmp/s42-jail/j2_chain/run/ledger.db?mode=ro', uri=True)
for r in c.execute('select id, status, started_at, finished_at from trials'): print('trial', r)"
echo "### C3 same chain with the driver as uid 65534 (trampoline alone)"
rm -rf /tmp/s42-jail2/nr; mkdir -p /tmp/s42-jail2/nr; chown 65534:65534 /tmp/s42-jail2/nr
CFG=$(python3 -c 'import json, os; w="/tmp/s42-jail2/nr"; st=os.stat(w); print(json.dumps({"writable":[{"path":w,"dev":st.st_dev,"ino":st.st_ino}],"workdir":w,"cwd":w,"ports":[443],"timeout_s":60}))')
echo '{}' | setpriv --reuid=65534 --regid=65534 --clear-groups env PIPE_AGENT_WORKDIR=/tmp/s42-jail2/nr \
  python3 -I -S runner/search/agents/confine.py "$CFG" -- python3 $PWD/$H/agent_deepchain.py 230 2; echo " rc=$?"
sleep 1; echo "survivors: $(grep -c survived /tmp/s42-jail2/nr/helper.log)"
echo "### S careless writable folders pipe validate accepts"
python $H/check_spec2.py
rmdir /root/.ssh /root/.triton /root/.nv 2>/dev/null; true
