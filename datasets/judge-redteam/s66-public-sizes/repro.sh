#!/bin/bash
# Red team B (ranges): a kernel fast only at the sizes a range run makes public.
# Run from /tmp/rtB with the venv active. ~1.5 min on 2 cores.
set -e
cd /tmp/rtB && . .venv/bin/activate
export PIPE_CACHE_DIR=/tmp/rtB/out/cache
rm -rf out/runR
pipe run out/proj/pipelines/grid.yaml --run-dir out/runR --max-trials 2 2>&1 | grep '^\['
pipe compare out/runR --no-compile --rounds 6 --top 2 --points 8 --verify-sizes 8 2>&1 \
  | grep -E '^  (N |exactly|verified)|worst regret|cut from'
# both table kernels side by side (pipe's own compare request) at each range's public point
# and at 3 secret non-power-of-two sizes inside it
python out/between.py out/runR 2>&1 | grep -E '^(public|secret)'
