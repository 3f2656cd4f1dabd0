#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repo root, with .whl carried
# (make it here with `bash tools/device-wheels.sh`):
#   bash tools/device-run.sh WHAT...
# WHAT, any number, in order:
#   tests                   the gpu-marked tests
#   suite                   the whole test suite
#   run:SPEC[:ARGS]         pipe run SPEC into /tmp/runs/NAME (ARGS: extra pipe run options,
#                           commas for spaces, e.g. run:pipelines/softmax-h200.yaml:--max-trials,40)
#   record:SPEC[:ARGS]      pipe record SPEC: the whole space as a replay dataset
#   compare:NAME[:ARGS]     pipe compare /tmp/runs/NAME (a run made earlier in the same call)
#   e2e[:ARGS]              pipe export of the softmax, RMSNorm and cross-entropy runs made earlier in
#                           the same call (else of tests/data/*-h200-run), then benchmarks/e2e.py
#   pack                    everything under $OUT into $OUT/out.tgz (the device returns few files)
# Results and logs land in $OUT/NAME/, the run folders (ledger, best/, compare.json) in $OUT/NAME/run/.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PIPE_CACHE_DIR=/tmp/pipe-cache-$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c "import torch, triton, cuda.core; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda.core', cuda.core.__version__)" | tee -a "$OUT/machine.txt"
for w in "$@"; do
  IFS=: read -r kind arg extra <<< "$w"
  extra=${extra//,/ }
  t0=$(date +%s)
  case $kind in
    tests) python3 -m pytest -q -m gpu -rA tests/ -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" ;;
    suite) python3 -m pytest -q -p no:cacheprovider tests/ 2>&1 | tee "$OUT/suite.log" ;;
    run|record)
      name=$(basename "$arg" .yaml); d="$OUT/$name"; mkdir -p "$d"; RUN=/tmp/runs/$name
      if [ "$kind" = run ]; then
        python3 -m runner.cli run "$arg" --run-dir "$RUN" $extra 2>&1 | tee "$d/run.log"
      else
        RUN=/tmp/runs/$name-record
        python3 -m runner.cli record "$arg" --run-dir "$RUN" --out "$d/$name.json" $extra 2>&1 | tail -20 | tee "$d/record.log"
      fi
      echo "exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s" | tee -a "$d/$kind.log"
      python3 -m runner.cli show "$RUN" > "$d/$kind-show.txt" 2>&1
      python3 -m runner.cli show "$RUN" --json > "$d/$kind-show.json" 2>/dev/null
      cp "$RUN/trials.tsv" "$d/$kind-trials.tsv" 2>/dev/null
      cp "$RUN/run.json" "$d/$kind-run.json" 2>/dev/null
      tail -200 "$RUN/worker.log" > "$d/$kind-worker.log" 2>/dev/null
      if [ "$kind" = run ]; then mkdir -p "$d/run" && cp -r "$RUN/." "$d/run/" && rm -f "$d/run/worker.log" "$d/run/.lock"; fi
      ;;
    compare)
      d="$OUT/$arg"; mkdir -p "$d"
      python3 -m runner.cli compare "/tmp/runs/$arg" --json "$d/compare.json" $extra 2>&1 | tee "$d/compare.txt"
      echo "exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s" | tee -a "$d/compare.txt"
      cp "/tmp/runs/$arg/compare.json" "$d/run/" 2>/dev/null
      ;;
    e2e)
      d="$OUT/e2e"; mkdir -p "$d"; rm -rf /tmp/exported
      for r in softmax-h200 rmsnorm-h200 cross-entropy-h200; do
        src=/tmp/runs/$r; [ -f "$src/ledger.db" ] || src=tests/data/$r-run
        python3 -m runner.cli export "$src" --out /tmp/exported 2>&1 | tee -a "$d/export.txt"
      done
      python3 benchmarks/e2e.py --exported /tmp/exported --json "$d/e2e.json" $extra 2>&1 | tee "$d/e2e.txt"
      ;;
    pack) (cd "$OUT" && tar czf /tmp/out.tgz --exclude=out.tgz . && find . -mindepth 1 -delete && mv /tmp/out.tgz .) ;;
    *) echo "unknown: $w" ;;
  esac
done
