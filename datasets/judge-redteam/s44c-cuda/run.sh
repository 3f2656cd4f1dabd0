#!/bin/bash
# Session 44c red team: each variant judged as a trial judges it (pipe render --variant --compile),
# from the scratch clone's root with its venv. Output: run.out, evidence.out
cd "$(dirname "$0")/.." && . .venv/bin/activate
python redteam-s44c/mk.py
for f in redteam-s44c/v*.cu.j2 redteam-s44c/c*.cu.j2; do
  echo "=== $f"
  echo "\$ pipe render pipelines/softmax-h200.yaml --variant $f --compile"
  pipe render pipelines/softmax-h200.yaml --variant "$f" --compile 2>&1 | head -c 600; echo " [rc=${PIPESTATUS[0]}]"
done
echo "=== evidence: forbidden-class opcodes in each passing variant's PTX/SASS vs the approved build (evidence.out)"
python redteam-s44c/evidence.py redteam-s44c/v0[2-7]*.cu.j2 > redteam-s44c/evidence.out 2>&1
cat redteam-s44c/evidence.out
