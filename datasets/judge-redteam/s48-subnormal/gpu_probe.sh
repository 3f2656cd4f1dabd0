#!/bin/bash
# On a GPU machine, from the repo root, after tools/device-run.sh has installed the wheels
# (PYTHONPATH /tmp/site): the approved templates of the GPU specs judged with the subnormal
# witness rows switched on for the CUDA backend (judge/inputs.SUBNORMAL_BACKENDS patched in this
# copy of the tree only). Whether the tensor cores' builds keep bf16 subnormals: each `ok` says
# they do at that spec's start; a `wrong` names the elements.
#   bash datasets/judge-redteam/s48-subnormal/gpu_probe.sh OUT_DIR [SPEC...]
out=${1:-/tmp/s48-subnormal-gpu}; shift; mkdir -p "$out"
specs=${*:-"moe-fine-h200 moe-fine-tma-h200 decode-attention-h200 softmax-h200"}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
sed -i 's/^SUBNORMAL_BACKENDS = ("cpu",)$/SUBNORMAL_BACKENDS = ("cpu", "cuda")/' runner/judge/inputs.py
grep -q '^SUBNORMAL_BACKENDS = ("cpu", "cuda")$' runner/judge/inputs.py || { echo "patch failed" | tee "$out/probe.txt"; exit 1; }
for s in $specs; do
  t0=$(date +%s)
  python3 -m runner.cli eval pipelines/$s.yaml --params '{}' --run-dir /tmp/s48-sub-$s --json --no-hw-check \
    > "$out/$s.json" 2> "$out/$s.err"
  v=$(python3 -c "import json,sys; d=json.load(open('$out/$s.json')); print(d['status'], '|', (d.get('reason') or '')[:500])" 2>/dev/null \
      || echo "ERR $(tail -3 "$out/$s.err")")
  echo "$s ($(( $(date +%s) - t0 )) s): $v" | tee -a "$out/probe.txt"
done
sed -i 's/^SUBNORMAL_BACKENDS = ("cpu", "cuda")$/SUBNORMAL_BACKENDS = ("cpu",)/' runner/judge/inputs.py
