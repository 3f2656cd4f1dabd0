#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repo root, with .whl carried:
#   bash tools/device-run.sh [what...]
# what: tests (gpu-marked tests), suite (the whole test suite), record (the softmax
# space, exhaustively, as a replay dataset), run (pipe run on the
# softmax pipeline); default: tests run. Results and logs land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PIPE_CACHE_DIR=/tmp/pipe-cache-$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader
python3 -c "import torch, triton, cuda.core; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda.core', cuda.core.__version__)"
what=${*:-tests run}
for w in $what; do
  case $w in
    tests) python3 -m pytest -q -m gpu -rA tests/ -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" ;;
    suite) python3 -m pytest -q -p no:cacheprovider tests/ 2>&1 | tee "$OUT/suite.log" ;;
    record)
      t0=$(date +%s)
      python3 -m runner.cli record pipelines/softmax-h200.yaml --run-dir /tmp/rec-$(date +%s) --out "$OUT/softmax-h200.json" 2>&1 | tail -5 | tee "$OUT/record.log"
      echo "record took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/record.log"
      ;;
    run)
      RUN=/tmp/run-softmax-$(date +%s); SPEC=${PIPE_RUN_SPEC:-pipelines/softmax-h200.yaml}
      t0=$(date +%s)
      python3 -m runner.cli run $SPEC --run-dir $RUN ${PIPE_RUN_ARGS:-} 2>&1 | tee "$OUT/softmax-run.log"
      echo "exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/softmax-run.log"
      python3 -m runner.cli show $RUN | tee "$OUT/softmax-show.txt"
      python3 -m runner.cli show $RUN --json > "$OUT/softmax-show.json"
      cp $RUN/trials.tsv "$OUT/softmax-trials.tsv"
      cp $RUN/worker.log "$OUT/softmax-worker.log" 2>/dev/null
      ;;
  esac
done
