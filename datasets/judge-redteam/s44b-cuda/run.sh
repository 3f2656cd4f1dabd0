#!/bin/bash
# Session 44b red team: each variant judged as a trial judges it (pipe render --variant --compile),
# from the repo root with the scratch venv. Output: run.out
cd "$(dirname "$0")/.." && . .venv/bin/activate
python redteam-s44b/mk.py
for f in redteam-s44b/v*.cu.j2 redteam-s44b/c*.cu.j2 ${EXTRA}; do
  echo "=== $f"
  echo "\$ pipe render pipelines/softmax-h200.yaml --variant $f --compile"
  pipe render pipelines/softmax-h200.yaml --variant "$f" --compile 2>&1 | head -c 700; echo " [rc=${PIPESTATUS[0]}]"
done
echo "=== evidence: forbidden opcodes in each passing variant's PTX/SASS vs the approved build (evidence.out)"
python redteam-s44b/evidence.py redteam-s44b/v0{1,2,3,4,6}*.cu.j2 redteam-s44b/v07b*.cu.j2 redteam-s44b/v08b*.cu.j2 redteam-s44b/v09*.cu.j2 redteam-s44b/v10*.cu.j2 > redteam-s44b/evidence.out 2>&1
echo "=== #if conditions: pcpp's branch (with the NVRTC probe) vs NVRTC's (cond.out)"
python redteam-s44b/scratch/cond.py > redteam-s44b/cond.out 2>&1
