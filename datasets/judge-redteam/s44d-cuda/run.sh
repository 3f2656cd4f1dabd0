#!/bin/bash
# Session 44d red team: each variant judged as a trial judges it (pipe render --variant --compile),
# from the scratch clone's root with its venv. Output: run.out, evidence.out, probe.out
cd "$(dirname "$0")/.." && . .venv/bin/activate
python redteam-s44d/mk.py
for f in redteam-s44d/c*.cu.j2 redteam-s44d/v*.cu.j2; do
  echo "=== $f"
  echo "\$ pipe render pipelines/softmax-h200.yaml --variant $f --compile"
  pipe render pipelines/softmax-h200.yaml --variant "$f" --compile 2>&1 | tail -c 600; echo " [rc=${PIPESTATUS[0]}]"
done
echo "=== evidence: forbidden-class opcodes in each accepted variant's PTX/SASS vs the approved build (evidence.out)"
python redteam-s44d/evidence.py redteam-s44d/v01b*.cu.j2 redteam-s44d/v02b*.cu.j2 redteam-s44d/v06*.cu.j2 \
  redteam-s44d/v07*.cu.j2 redteam-s44d/v09*.cu.j2 redteam-s44d/v10*.cu.j2 > redteam-s44d/evidence.out 2>&1
cat redteam-s44d/evidence.out
echo "=== NVRTC builtin probe (probe.out)"
python redteam-s44d/probe.py > redteam-s44d/probe.out 2>&1; cat redteam-s44d/probe.out
python redteam-s44d/reading.py redteam-s44d/v01b*.j2 redteam-s44d/v02b*.j2 redteam-s44d/v06*.j2 redteam-s44d/v07*.j2 redteam-s44d/v09*.j2 > redteam-s44d/reading.out 2>&1
