#!/bin/bash
# Reproduces red team s40's verdicts (README.md). Usage:
#   bash datasets/judge-redteam/s40-cpu/run.sh [WORK_DIR]     (default /tmp/s40; about 5 minutes on 2 cores)
# Builds a scratch project in WORK_DIR/proj (pipelines/ with moe-cpu at K = 4096 as in
# tests/test_lean.py, and this folder's softmax-cpu and decode-attention-cpu specs;
# kernel_templates/ holding links to the repo's moe_gemm.cpp.j2 and common/, and this folder's
# softmax_rt.cpp.j2 and decode_attention_rt.cpp.j2), then runs `pipe eval` on every variant and
# prints one line each: status, kept, the widest lean of the trial (ledger) or the refusing lean.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
W=${1:-/tmp/s40}
mkdir -p "$W/proj/pipelines" "$W/proj/kernel_templates" "$W/runs"
ln -sfn "$ROOT/hw_profiles" "$W/proj/hw_profiles"
ln -sfn "$ROOT/kernel_templates/common" "$W/proj/kernel_templates/common"
ln -sfn "$ROOT/kernel_templates/moe_gemm.cpp.j2" "$W/proj/kernel_templates/moe_gemm.cpp.j2"
for t in softmax_rt decode_attention_rt; do ln -sfn "$HERE/$t.cpp.j2" "$W/proj/kernel_templates/$t.cpp.j2"; done
cp "$HERE"/specs/*.yaml "$W/proj/pipelines/"
. "$ROOT/.venv/bin/activate"
python3 - "$ROOT" "$W" <<'PY'
import sys
from pathlib import Path
root, w = Path(sys.argv[1]), Path(sys.argv[2])
text = (root / "pipelines/moe-cpu.yaml").read_text()
for a, b in (('["T * 2", 64]', '["T * 2", 4096]'), ("[4, 96, 64]", "[4, 96, 4096]"),
             ('K: "64"', 'K: "4096"'), ("gemm_k: 64}", "gemm_k: 4096}")):
    assert a in text
    text = text.replace(a, b)
(w / "proj/pipelines/moe-cpu-k4096.yaml").write_text(text)
PY
one() {  # SPEC PARAMS VARIANT(or -) NAME
  local spec=$1 params=$2 var=$3 name=$4 v=()
  [ "$var" != "-" ] && v=(--variant "$HERE/$var.cpp.j2")
  rm -rf "$W/runs/$name"
  (cd "$W/proj" && python -m runner.cli eval "pipelines/$spec" --params "$params" "${v[@]}" \
      --run-dir "$W/runs/$name" --json > "$W/runs/$name.json" 2> "$W/runs/$name.err")
  python3 - "$W/runs" "$name" <<'PY'
import json, os, re, sqlite3, sys
runs, n = sys.argv[1:]
d = json.load(open(f"{runs}/{n}.json"))
lean, db = None, f"{runs}/{n}/ledger.db"
if os.path.exists(db):
    for (det,) in sqlite3.connect(db).execute("select details from trials"):
        lean = (json.loads(det) or {}).get("lean") if det else None
m = re.search(r"mean along the reference's sign is ([-+]\d\.\d+)", d.get("reason", ""))
print(f"{n:26s} {d['status']:9s} kept={d['kept']!s:5s} lean={lean or (m and m.group(1))}  {d.get('reason', '')[:140]}")
PY
}
MOE='{"MR":1,"NR":4}'
echo "== moe-cpu at K = 4096 (shipped template, then variants)"
one moe-cpu-k4096.yaml "$MOE" - moe_shipped
for v in moe_out_trunc moe_w_cut1 moe_prod_cut \
         moe_out_fudge_trunc moe_prod_cut_fudge moe_out_trunc_small moe_w_cut1_fudge moe_out_round_odd moe_out_floor \
         moe_honest_double moe_honest_kahan moe_honest_split8 moe_honest_splitk2; do
  one moe-cpu-k4096.yaml "$MOE" $v $v
done
echo "== decode-attention-cpu (this folder's spec; the template is honest fp32)"
one decode-attention-cpu.yaml '{"UNROLL":1}' - attn_honest
for v in attn_cut_lfp32 attn_cut_lcut attn_cut_fudge attn_cut_lcut_long attn_cut_fudge_long attn_rn_bf16; do
  one decode-attention-cpu.yaml '{"UNROLL":1}' $v $v
done
echo "== softmax-cpu: an HONEST template (fp32 math, round to nearest), offset inputs, then normal only"
for i in 1 2 3; do one softmax-cpu.yaml '{"UNROLL":1}' - softmax_honest_$i; done
one softmax-cpu-normal.yaml '{"UNROLL":1}' - softmax_honest_normal_only
echo "== the statistic on the judge's own verification plan (softmax-h200, softmax-range-h200, rmsnorm-*-h200)"
(cd "$ROOT" && python "$HERE/fp_statistic.py" --trials 10 --dists offset)
