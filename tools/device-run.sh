#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repo root, with .whl carried
# (make it here with `bash tools/device-wheels.sh`):
#   bash tools/device-run.sh WHAT...
# WHAT, any number, in order:
#   tests[:PATHS]           the gpu-marked tests (PATHS: test files or node ids joined by +, default all)
#   py:SCRIPT[:ARGS]        python3 SCRIPT ARGS, output appended to $OUT/NAME.txt (NAME: the script's; ARGS as for run;
#                           the text "OUT/" in ARGS becomes the results folder)
#   suite                   the whole test suite
#   hw[:ARGS]               pipe hw ARGS (commas for spaces): the GPU's copy, read and bf16 figures beside its
#                           profile's, into $OUT/hw/hw.txt and hw.json
#   run:SPEC[:ARGS[:TAG]]   pipe run SPEC into /tmp/runs/NAME (NAME: the spec's, plus TAG; ARGS: extra pipe run options,
#                           commas for spaces and + for commas, e.g. run:pipelines/softmax-h200.yaml:--max-trials,40
#                           or record:pipelines/softmax-h200.yaml:--only,EPT=16+32:-small)
#                           A run longer than one call: the first call's run folder comes back in $OUT/NAME/run;
#                           put it in runs/NAME here and carry that path, and the next call's run resumes it
#                           (--minutes is the run's whole budget: e.g. --minutes,8 then --minutes,12)
#   record:SPEC[:ARGS[:TAG]] pipe record SPEC: the whole space as a replay dataset. A sweep longer than
#                           one call: ARGS --minutes,M stops it; its run folder comes back in
#                           $OUT/NAME/run; put it in runs/NAME-record here and carry that path, and
#                           the next call's record resumes it
#   compare:NAME[:ARGS]     pipe compare /tmp/runs/NAME (a run made earlier in the same call, else
#                           the one carried in runs/NAME)
#   e2e[:ARGS]              pipe export of the softmax, RMSNorm and cross-entropy runs made earlier in
#                           the same call (else carried in runs/NAME, else tests/data/NAME-run), then
#                           benchmarks/e2e.py and tools/check_exported.py (every table entry on the GPU)
#   decode[:ARGS]           pipe export of the decode-attention run decode-attention-h200 and of the RMSNorm and
#                           softmax runs (the range run rmsnorm-range-h200 / softmax-range-h200, else the
#                           flagship's), each the first found with its pipe compare (compare.json; e.g.
#                           compare:decode-attention-h200:--no-arms) made earlier in the same call, else
#                           carried in runs/NAME, else kept in tests/data/NAME-run; then benchmarks/decode_step.py
#                           ARGS (commas for spaces, + for commas) into $OUT/decode/decode.json
#   gate:NAME               skip the remaining steps (pack aside) if a trial of NAME hung, faulted,
#                           was wrong or failed to compile, or NAME has none
#   occupancy:SPEC:ARGS     clusters resident at once against the grid launched (tools/cluster_occupancy.py)
#   ncu:SCRIPT[:ARGS]       python3 SCRIPT ARGS under Nsight Compute (--profile-from-start off: the script
#                           brackets what it wants profiled; clocks left alone), the report in $OUT/NAME.ncu-rep
#                           and its details as text in $OUT/ncu-NAME.txt (NAME: the script's)
#   pack                    everything under $OUT into $OUT/out.tgz (the device returns few files)
# Results and logs land in $OUT/NAME/, the run folders (ledger, best/, compare.json) in $OUT/NAME/run/.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
pack_out() { (cd "$OUT" && tar czf /tmp/out.tgz --exclude=out.tgz . && find . -mindepth 1 -delete && mv /tmp/out.tgz .); }
if [ "$*" = pack ]; then
  # pack alone (after a step list cut short by `timeout`): the first invocation's clock log
  # and machine notes stay as they are; a compare cut short leaves its finished parts in its
  # run folder: they come back in $OUT/NAME/run/compare-parts (put them in runs/NAME and
  # carry it, and the next call's compare resumes)
  for p in /tmp/runs/*/compare-parts; do
    [ -d "$p" ] || continue
    n=$(basename "$(dirname "$p")"); mkdir -p "$OUT/$n/run" && cp -r "$p" "$OUT/$n/run/"
  done
  pack_out
  exit 0
fi
rm -rf /tmp/runs  # a machine still warm from the last call keeps its runs: every call starts afresh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PIPE_CACHE_DIR=/tmp/pipe-cache-$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
# SM clock, power and temperature every half second for the whole call: a figure
# that moved can be read against the clock it ran at (clocks.csv).
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 500 > "$OUT/clocks.csv" 2>&1 &
SMI=$!
python3 -c "import torch, triton, cuda.core; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda.core', cuda.core.__version__)" | tee -a "$OUT/machine.txt"
skip=
for w in "$@"; do
  IFS=: read -r kind arg extra tag <<< "$w"
  if [ -n "$skip" ] && [ "$kind" != pack ]; then echo "skipped: $w ($skip)" | tee -a "$OUT/steps.txt"; continue; fi
  extra=${extra//,/ }; extra=${extra//+/,}
  t0=$(date +%s); echo "== $w $(date +%T)" >> "$OUT/steps.txt"
  case $kind in
    # -v: each test's name and verdict as it ends, so a call cut short by its time limit still
    # says which tests passed; --durations: which ones take the call's time
    # the whole word after "tests:", so that node ids keep their "::"
    # --timeout: a test (with its set-up) that outgrows TEST_TIMEOUT_S fails alone and the files
    # after it still run (session 41: one set-up took a whole call and nothing after it ran)
    tests) paths=${w#tests}; paths=${paths#:}; paths=${paths:-tests/}; tmo=; python3 -c "import pytest_timeout" 2>/dev/null && tmo=--timeout="${TEST_TIMEOUT_S:-360}"; python3 -m pytest -v -m gpu -rA --durations=0 $tmo ${paths//+/ } -p no:cacheprovider 2>&1 | tee -a "$OUT/gpu-tests.log" ;;
    py) n=$(basename "$arg" .py); python3 "$arg" ${extra//OUT\//$OUT/} 2>&1 | tee -a "$OUT/$n.txt" ;;
    ncu)
      n=$(basename "$arg" .py); NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
      "$NCU" --profile-from-start off --clock-control none --nvtx --graph-profiling node \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats -f -o "$OUT/$n" python3 "$arg" $extra 2>&1 | tee -a "$OUT/ncu-$n.txt"
      "$NCU" -i "$OUT/$n.ncu-rep" --page details >> "$OUT/ncu-$n.txt" 2>&1
      "$NCU" -i "$OUT/$n.ncu-rep" --print-nvtx-rename kernel --print-summary per-kernel >> "$OUT/ncu-$n.txt" 2>&1 ;;
    suite) python3 -m pytest -q -p no:cacheprovider tests/ 2>&1 | tee "$OUT/suite.log" ;;
    # pipe hw: this GPU's copy, read and bf16 figures beside its profile's (hw[:ARGS], e.g. hw:--reps,30)
    hw) mkdir -p "$OUT/hw"; args=${arg//,/ }; args=${args//+/,}
        python3 -m runner.cli hw $args --json "$OUT/hw/hw.json" 2>&1 | tee "$OUT/hw/hw.txt" ;;
    run|record)
      name=$(basename "$arg" .yaml)$tag; d="$OUT/$name"; mkdir -p "$d"; RUN=/tmp/runs/$name
      if [ "$kind" = run ]; then
        # a run begun in an earlier call, carried in runs/NAME: resume it (--minutes budgets the
        # run's whole time, the earlier calls' included)
        if [ -f "runs/$name/ledger.db" ] && [ ! -d "$RUN" ]; then mkdir -p /tmp/runs && cp -r "runs/$name" "$RUN"; fi
        python3 -m runner.cli run "$arg" --run-dir "$RUN" $extra 2>&1 | tee "$d/run.log"
      else
        RUN=/tmp/runs/$name-record
        # a sweep begun in an earlier call, carried in runs/NAME-record: resume it
        if [ -f "runs/$name-record/ledger.db" ] && [ ! -d "$RUN" ]; then mkdir -p /tmp/runs && cp -r "runs/$name-record" "$RUN"; fi
        python3 -m runner.cli record "$arg" --run-dir "$RUN" --out "$d/$name.json" $extra 2>&1 | tail -20 | tee "$d/record.log"
      fi
      echo "exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s" | tee -a "$d/$kind.log"
      python3 -m runner.cli show "$RUN" > "$d/$kind-show.txt" 2>&1
      python3 -m runner.cli show "$RUN" --json > "$d/$kind-show.json" 2>/dev/null
      cp "$RUN/trials.tsv" "$d/$kind-trials.tsv" 2>/dev/null
      cp "$RUN/run.json" "$d/$kind-run.json" 2>/dev/null
      tail -200 "$RUN/worker.log" > "$d/$kind-worker.log" 2>/dev/null
      mkdir -p "$d/run" && cp -r "$RUN/." "$d/run/" && rm -f "$d/run/worker.log" "$d/run/.lock"
      ;;
    compare)
      d="$OUT/$arg"; mkdir -p "$d"
      # a run made earlier in this call, else one carried in runs/ (carry: ["runs/NAME"])
      [ -f "/tmp/runs/$arg/ledger.db" ] || { [ -f "runs/$arg/ledger.db" ] && mkdir -p /tmp/runs && cp -r "runs/$arg" "/tmp/runs/$arg"; }
      python3 -m runner.cli compare "/tmp/runs/$arg" --json "$d/compare.json" $extra 2>&1 | tee "$d/compare.txt"
      echo "exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s" | tee -a "$d/compare.txt"
      mkdir -p "$d/run" && cp "/tmp/runs/$arg/compare.json" "$d/run/" 2>/dev/null
      # a compare cut short by the call's limit: its finished parts, for the next call to resume
      # (copy them into runs/$arg and carry it)
      [ -d "/tmp/runs/$arg/compare-parts" ] && cp -r "/tmp/runs/$arg/compare-parts" "$d/run/"
      ;;
    gate)
      # stop here (pack still runs) if the run or record NAME has no trial, or one that hung,
      # faulted, was wrong or failed to compile
      bad=$(awk -F'\t' 'FNR>1 && $2 ~ /hang|fault|wrong|error|timeout/{print $1" "$2}' "$OUT/$arg"/*-trials.tsv 2>/dev/null | head -5)
      n=$(awk -F'\t' 'FNR>1' "$OUT/$arg"/*-trials.tsv 2>/dev/null | wc -l)
      if [ "$n" = 0 ] || [ -n "$bad" ]; then skip="gate $arg: $n trials, not ok: ${bad:-none recorded}"; echo "$skip"; fi ;;
    occupancy)
      python3 tools/cluster_occupancy.py "$arg" $extra 2>&1 | tee -a "$OUT/occupancy.txt" ;;
    e2e)
      d="$OUT/e2e"; mkdir -p "$d"; rm -rf /tmp/exported
      for r in softmax-h200 rmsnorm-h200 cross-entropy-h200; do
        # a run of this call, else one carried in runs/ (carry: ["runs/NAME"]), else the kept
        # test run; a run folder with project/ carries the spec it was made with
        src=/tmp/runs/$r; spec=()
        [ -f "$src/ledger.db" ] || src=runs/$r
        [ -f "$src/ledger.db" ] || src=tests/data/$r-run
        for p in "$src" "runs/$r"; do  # the run folder's frozen project/, or its carried copy's
          [ -f "$p/project/pipelines/$r.yaml" ] && { spec=(--spec "$p/project/pipelines/$r.yaml"); break; }
        done
        python3 -m runner.cli export "$src" --out /tmp/exported "${spec[@]}" 2>&1 | tee -a "$d/export.txt"
      done
      args=${arg//,/ }; args=${args//+/,}  # e2e:ARGS: the benchmark's options (ARGS is the second field)
      python3 benchmarks/e2e.py --exported /tmp/exported --json "$d/e2e.json" $args 2>&1 | tee "$d/e2e.txt"
      python3 tools/check_exported.py /tmp/exported 2>&1 | tee "$d/check-exported.txt"
      ;;
    decode)
      d="$OUT/decode"; mkdir -p "$d"; rm -rf /tmp/exported-decode; names=
      # the first of an op's runs found with its compare.json: one of this call, else carried in runs/,
      # else a kept test run
      for runs in decode-attention-h200 "rmsnorm-range-h200 rmsnorm-h200" "softmax-range-h200 softmax-h200"; do
        src=; spec=()
        for r in $runs; do
          for s in /tmp/runs/$r runs/$r tests/data/$r-run; do
            [ -f "$s/ledger.db" ] && [ -f "$s/compare.json" ] && { src=$s; break 2; }
          done
        done
        if [ -z "$src" ]; then  # named all the same: decode_step.py says which package is missing
          r=${runs%% *}; names=$names${names:+,}${r//-/_}
          echo "decode: no run of $runs with its compare.json (make them in this call or carry runs/NAME)" \
            | tee -a "$d/export.txt"; continue
        fi
        for p in "$src" "runs/$r"; do  # the run folder's frozen project/, or its carried copy's
          [ -f "$p/project/pipelines/$r.yaml" ] && { spec=(--spec "$p/project/pipelines/$r.yaml"); break; }
        done
        python3 -m runner.cli export "$src" --out /tmp/exported-decode "${spec[@]}" 2>&1 | tee -a "$d/export.txt"
        names=$names${names:+,}${r//-/_}
      done
      args=${arg//,/ }; args=${args//+/,}
      python3 benchmarks/decode_step.py --exported /tmp/exported-decode --names "$names" --json "$d/decode.json" $args 2>&1 | tee "$d/decode.txt"
      ;;
    pack) kill $SMI 2>/dev/null; pack_out ;;
    *) echo "unknown: $w" ;;
  esac
done
