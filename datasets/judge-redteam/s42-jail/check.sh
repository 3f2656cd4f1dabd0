#!/bin/sh
# Reproduces every attempt of this red-team (s42-jail). About 2 minutes on 2 cores.
# Everything is aimed at scratch copies under /tmp/s42-jail; the agent is always confined.
set -u
cd /work/main && . .venv/bin/activate
H=datasets/judge-redteam/s42-jail
echo "### T1 trampoline battery (victim process/file/sockets/loop device of this script's own)"
python $H/check_caps.py
echo "### T2 /proc/PID/{fd,map_files} of another process (memfd arena, pipes)"
python $H/check_procfd.py
echo "### T3 io_uring, unshare+mount, SCHED_FIFO, /dev/mem, BPF program"
mkdir -p /tmp/s42-jail/more
CFG=$(python -c 'import json, os; st = os.stat("/tmp/s42-jail/more"); print(json.dumps({"writable": [{"path": "/tmp/s42-jail/more", "dev": st.st_dev, "ino": st.st_ino}], "ports": [443], "timeout_s": 30}))')
python -I -S runner/search/agents/confine.py "$CFG" -- python $H/probe_more.py
echo "### E2b kill the trampoline, a helper survives"
sh $H/check_killtramp.sh
echo "### E1 pipe run: scheduling/limits of the driver and the judge's worker, metadata of the run folder"
python $H/harness.py e1_sched $H/agent_sched.py --trials 2 | grep -v "^reply event"
echo "### E2 pipe run: ptrace the trampoline into exit_group(0); the helper lives on through the timings"
python $H/harness.py e2_escape $H/agent_escape.py --trials 3 --opt 'workdir="/tmp/s42-jail/e2_agentwork"' --arg 15 | grep -v "^reply event"
cat /tmp/s42-jail/e2_agentwork/helper.log | tail -4
echo "### E3 pipe run: verdict and record changed with no write right"
for m in cpu_bomb immutable fsize; do
  python $H/harness.py e3_$m $H/agent_verdict.py --trials 3 --arg $m | grep -v "^reply event" | tail -12
  python -c "import json,sys; d=json.load(open('/tmp/s42-jail/e3_$m/run/run.json')); print('run.json status:', d.get('status'), 'trials:', d.get('trials'))"
done
chattr -i /tmp/s42-jail/e3_immutable/run/ledger.db /tmp/s42-jail/e3_immutable/run/ledger.db-wal /tmp/s42-jail/e3_immutable/run 2>/dev/null
echo "### E4 pipe run: workdir inside a writable folder, swapped for a symlink to the run folder"
rm -rf /tmp/s42-jail/e4_outer; mkdir -p /tmp/s42-jail/e4_outer
python $H/harness.py e4_symlink $H/agent_symlink.py --trials 4 --opt 'workdir="/tmp/s42-jail/e4_outer/work"' \
  --opt 'writable=["/tmp/s42-jail/e4_outer"]' | grep -v "^reply event"
ls -la /tmp/s42-jail/e4_symlink/run
echo "### S spec-side: what pipe validate accepts"
python $H/check_spec.py
env -u PIPE_CACHE_DIR .venv/bin/pipe validate $H/specproj/pipelines/agent.yaml
